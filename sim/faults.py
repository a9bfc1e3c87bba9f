"""What goes wrong in a simulated run: clients that cancel, prefill and decode workers that
die (and come back). How the deployment reacts is not modelled here: it is the decode
node's real fail-over policy (`DecodeNode`'s, with `ClusterConfig.failover`) acting on the
real scheduler's `retry_remote`, `finish_requests` and holds, and the router's real
`Dispatcher.on_failure` (eject, retry elsewhere or end the stream in error).

A worker that dies loses everything: its queue, its KV cache, its writes in flight. Decode
nodes see the connection drop one network hop later (as `PrefillClient.lost()` reports it)
and fail over every attempt waiting on it; the router's health checks eject it after
`EJECT_AFTER` failed rounds. A restarted worker is a fresh node with a new agent name: the
router resyncs its prefix index, and it confirms aborts of attempts it never heard of, so
the decode nodes' holds on them end.

A decode worker that dies loses its requests: the router's streams to it break one hop
later, and the router retries those that had streamed no token and ends the others with an
error; prefill workers' writes to it fail, ending their jobs. See `sim/outages.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

ROLES = ("prefill", "decode")


@dataclass(frozen=True)
class Outage:
    """Worker `worker` (its index in the `role` pool) dies at `at_s`; it restarts
    `restart_after_s` later (None: it stays down)."""

    worker: int
    at_s: float
    restart_after_s: float | None = None
    role: str = "prefill"

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"an outage's role is prefill or decode, not {self.role!r}")
        if self.worker < 0 or self.at_s < 0:
            raise ValueError("an outage needs a worker index >= 0 and a time >= 0")
        if self.restart_after_s is not None and self.restart_after_s <= 0:
            raise ValueError("a restart delay must be positive")

    @classmethod
    def parse(cls, text: str, role: str = "prefill") -> Outage:
        """`I@T` or `I@T+R`: `role` worker I dies at T seconds, back R seconds later."""
        try:
            worker, when = text.split("@")
            at, _, restart = when.partition("+")
            return cls(int(worker), float(at), float(restart) if restart else None, role)
        except ValueError as exc:
            raise ValueError(f"expected WORKER@SECONDS[+RESTART], got {text!r}: {exc}") from exc


@dataclass(frozen=True)
class Faults:
    """`abort_share` of the requests (chosen by `seed`) are cancelled by their client
    `abort_after_s` after they arrive, if they have not finished by then."""

    abort_share: float = 0.0
    abort_after_s: float = 1.0
    outages: tuple[Outage, ...] = ()
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.abort_share <= 1 or self.abort_after_s < 0:
            raise ValueError("abort_share must be in [0, 1] and abort_after_s >= 0")

    def aborted(self, request_ids: Sequence[str]) -> set[str]:
        """The ids whose clients cancel: the same for the same ids and seed."""
        if not self.abort_share:
            return set()
        rng = np.random.default_rng(self.seed)
        picks = rng.random(len(request_ids)) < self.abort_share
        return {rid for rid, pick in zip(request_ids, picks) if pick}

    @property
    def any(self) -> bool:
        return bool(self.abort_share or self.outages)
