"""Host cores shared by the nodes of one CPU host (`tandem serve` on one machine), as
processor sharing: while `n` nodes step and other work keeps `background` cores busy, every
step runs at `min(1, cores / (n + background))` of its speed alone. The rate is re-taken
whenever a step starts or ends, so a long prefill step slows down from the moment decode
steps join it and speeds up when they leave (a stretch fixed at a step's start, the former
model, missed both). With `cores` 0 every node has a device of its own: steps take their
time alone.

Single-threaded processes on the host (the router, the clients: `sim/host_process.py`) take
one share while they work, as a node does while it steps.

Steps on one host also slow each other down beyond their share of the cores: a prefill
step's matrix products evict a decode step's weights and KV from the shared caches and take
the memory bandwidth, so a decode step's own work grows by `interference` per prefill step
running beside it (measured from the nodes' step logs, `sim.interference.fit_interference`:
a decode step's runner CPU against the prefill steps overlapping it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tandem.sim.events import EventQueue


@dataclass
class _Step:
    work_s: float  # left, in seconds alone
    done: Callable[..., None]
    args: tuple[Any, ...]
    role: str = ""  # "prefill", "decode", or "" for a host process's work


class SharedCores:
    """The steps in progress on the host and their common rate."""

    def __init__(
        self, events: EventQueue, cores: int, background: float = 0.0, interference: float = 0.0
    ) -> None:
        self.events = events
        self.cores = cores
        self.background = background
        self.interference = interference
        self._steps: dict[int, _Step] = {}  # by owner id
        self._since = 0.0  # when the work left was last brought up to date
        self._generation = 0  # end events of an older generation are stale

    @property
    def num_stepping(self) -> int:
        return len(self._steps)

    def rate(self) -> float:
        """Speed of each step now, against the step alone on a core (a decode step's
        interference aside, `rate_of`)."""
        if not self.cores or not self._steps:
            return 1.0
        return min(1.0, self.cores / (len(self._steps) + self.background))

    def rate_of(self, role: str) -> float:
        """Speed now of a step of `role`: its share of the cores, less the interference of
        the prefill steps beside a decode step."""
        if role != "decode" or not self.interference:
            return self.rate()
        prefills = sum(1 for step in self._steps.values() if step.role == "prefill")
        return self.rate() / (1.0 + self.interference * prefills)

    def start(
        self, owner: object, work_s: float, done: Callable[..., None], *args: Any, role: str = ""
    ) -> None:
        """`owner` starts a step of `work_s` seconds alone; `done(*args)` at its end."""
        if not self.cores:
            self.events.after(work_s, done, *args)
            return
        self._advance()
        self._steps[id(owner)] = _Step(work_s, done, args, role)
        self._reschedule()

    def stop(self, owner: object) -> None:
        """`owner` died in the middle of its step: it no longer takes a share."""
        if id(owner) in self._steps:
            self._advance()
            del self._steps[id(owner)]
            self._reschedule()

    def _advance(self) -> None:
        now, rates = self.events.now, self._rates()
        for step in self._steps.values():
            step.work_s = max(0.0, step.work_s - (now - self._since) * rates[step.role])
        self._since = now

    def _reschedule(self) -> None:
        self._generation += 1
        rates = self._rates()
        for key, step in self._steps.items():
            self.events.after(step.work_s / rates[step.role], self._end, key, self._generation)

    def _rates(self) -> dict[str, float]:
        return {role: self.rate_of(role) for role in ("", "prefill", "decode")}

    def _end(self, key: object, generation: int) -> None:
        if generation != self._generation:
            return
        self._advance()
        step = self._steps.pop(key)
        self._reschedule()
        step.done(*step.args)
