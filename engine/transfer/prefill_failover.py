"""The decode node's remote-prefill fail-over, on the real `Scheduler` and `KVCacheManager`.

One piece of control code with two drivers: `DecodeNode` (wall clock, ZMQ, metrics, log
lines) and the simulator's `SimDecode` (simulated clock, event queue). It keeps no clock and
sends nothing itself: each call takes `now`, aborts go out through the `send_abort` callback
(False: the worker is not connected), and what the driver must do about an attempt that
failed comes back as a `Fallback`.

Policy: a deadline (`prefill_timeout_s`), a failure report, a dropped connection or a send
that could not be queued moves the request to the first untried alternate prefill worker
once, then prefills it here (`recompute`) or fails it (`fail`). Destination blocks of an
abandoned attempt (`Scheduler.abandoned_remote`) stay held until the prefill worker confirms
that nothing more will land in them; the abort is sent again every `ABORT_RESEND_S` until
then, so a worker that died and restarted (its successor never heard of the attempt, and
confirms at once) gives the blocks back as soon as it is up.

Fencing: a block is reused only when no write into it can still land. A hold whose
`hold_timeout_s` passes without a confirmation is *quarantined*, not released: its blocks
stay out of the free pool (and are counted apart) until the worker confirms late, or its
control connection drops (`writer_lost`: the process died, and its posted writes with it).
A hold whose worker was already lost when its timeout passes is released then.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tandem.engine.core.kv_cache_manager import KVCacheManager
from tandem.engine.core.request import Request, RequestStatus
from tandem.engine.core.scheduler import RemoteHold, Scheduler, remote_hold_key

# Seconds between two sends of an abort that no prefill worker has confirmed yet.
ABORT_RESEND_S = 1.0


@dataclass(frozen=True)
class DecodeOptions:
    remote_prefill_threshold: int = 0
    on_prefill_failure: str = "recompute"  # or "fail"
    prefill_timeout_s: float = 30.0
    hold_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if self.on_prefill_failure not in ("recompute", "fail"):
            raise ValueError("on_prefill_failure must be 'recompute' or 'fail'")
        if self.remote_prefill_threshold < 0 or self.prefill_timeout_s <= 0:
            raise ValueError("threshold must be >= 0 and the prefill timeout > 0")


@dataclass
class Attempts:
    """One request's prefill workers: the router's alternates, those tried, and the current
    attempt's deadline."""

    alternates: list[str]
    tried: list[str] = field(default_factory=list)
    deadline: float = 0.0


@dataclass(frozen=True)
class HoldExpiry:
    """A hold whose timeout passed unconfirmed: `quarantined` (its writer may still write)
    or released (its writer's connection was lost before)."""

    key: str
    worker: str
    quarantined: bool


@dataclass(frozen=True)
class Fallback:
    """What the policy did with a failed attempt: `retry_on` the next worker, prefill here
    (`local`), or neither (`failed`: the scheduler has finished the request in error and the
    driver ends its stream)."""

    reason: str
    retry_on: str | None
    local: bool

    @property
    def failed(self) -> bool:
        return self.retry_on is None and not self.local

    @property
    def action(self) -> str:
        if self.retry_on is not None:
            return f"retrying on {self.retry_on}"
        return "prefilling locally" if self.local else "failing it"


class PrefillFailover:
    """Owns each request's attempts and the holds of abandoned attempts: their deadlines and
    the aborts not confirmed yet."""

    def __init__(
        self,
        scheduler: Scheduler,
        options: DecodeOptions,
        send_abort: Callable[[RemoteHold], bool],
    ) -> None:
        self.scheduler = scheduler
        self.kv: KVCacheManager = scheduler.kv
        self.options = options
        self.send_abort = send_abort
        self.attempts: dict[str, Attempts] = {}  # request id ->
        self.hold_deadlines: dict[str, float] = {}  # hold key ->
        self.unconfirmed: dict[str, RemoteHold] = {}  # same keys: the aborts to resend
        self.quarantined: set[str] = set()  # unconfirmed keys past their hold timeout
        self.lost: set[str] = set()  # unconfirmed keys whose worker's connection dropped
        self.next_resend = 0.0

    # -- requests ---------------------------------------------------------------------------

    def track(self, request: Request, alternates: list[str]) -> None:
        """A new request: the router's alternates to its prefill worker, best first."""
        others = [a for a in alternates if a != request.prefill_worker]
        self.attempts[request.request_id] = Attempts(others)

    def forget(self, request_id: str) -> None:
        """The request ended (its holds, if any, live on under their own keys)."""
        self.attempts.pop(request_id, None)

    def sent(self, request: Request, now: float) -> None:
        """The current attempt goes to `request.prefill_worker` now; its deadline starts."""
        attempts = self.attempts[request.request_id]
        attempts.tried.append(request.prefill_worker)
        attempts.deadline = now + self.options.prefill_timeout_s

    def current(self, request_id: str, attempt: int) -> Request | None:
        """The request if it waits for exactly this attempt (else the attempt is late)."""
        request = self.scheduler.remote.get(request_id)
        if request is None or request.status != RequestStatus.WAITING_FOR_REMOTE_KV:
            return None
        return request if request.num_remote_attempts == attempt else None

    def worker_of(self, request_id: str, attempt: int) -> str | None:
        """The prefill worker the attempt was sent to, while it is current or its blocks
        are held for it; None once nothing of it is expected."""
        if (request := self.current(request_id, attempt)) is not None:
            return request.prefill_worker
        key = remote_hold_key(request_id, attempt)
        if (hold := self.unconfirmed.get(key)) is not None:
            return hold.worker
        abandoned = (h for h in self.scheduler.abandoned_remote if h.key == key)
        return next((h.worker for h in abandoned), None)

    def waiting_on(self, worker: str) -> list[Request]:
        """The requests whose current attempt is on `worker`."""
        return [r for r in self.scheduler.remote.values() if r.prefill_worker == worker]

    def overdue(self, now: float) -> list[Request]:
        """The requests whose current attempt passed its deadline."""
        remote = self.scheduler.remote.values()
        return [r for r in remote if now >= self.attempts[r.request_id].deadline]

    def fall_back(self, request_id: str, reason: str) -> Fallback:
        """Retry on another worker once, then recompute here or fail, per the policy; the
        scheduler's side is done (`retry_remote`, or `finish_requests` in error)."""
        attempts = self.attempts[request_id]
        untried = [w for w in attempts.alternates if w not in attempts.tried]
        if len(attempts.tried) < 2 and untried:
            decision = Fallback(reason, untried[0], local=False)
        else:
            decision = Fallback(reason, None, self.options.on_prefill_failure == "recompute")
        if decision.failed:
            self.scheduler.finish_requests([request_id], RequestStatus.FINISHED_ERROR)
            self.forget(request_id)
        else:
            self.scheduler.retry_remote(request_id, decision.retry_on)
        return decision

    # -- holds of abandoned attempts -------------------------------------------------------

    def send_aborts(self, now: float) -> list[RemoteHold]:
        """Resend the unconfirmed aborts when `ABORT_RESEND_S` has passed (the first may have
        died with its worker), then hold and abort the attempts abandoned since the last
        call. Returns the new ones whose abort could not be sent (resent later)."""
        if now >= self.next_resend:
            self.next_resend = now + ABORT_RESEND_S
            for hold in list(self.unconfirmed.values()):
                self.send_abort(hold)
        unsent = []
        for hold in self.scheduler.abandoned_remote:
            if not self.kv.is_held(hold.key):
                self.lost.discard(hold.key)
                continue  # already released: the worker reported that nothing is in flight
            self.hold_deadlines[hold.key] = now + self.options.hold_timeout_s
            self.unconfirmed[hold.key] = hold
            if not self.send_abort(hold):
                unsent.append(hold)
        self.scheduler.abandoned_remote.clear()
        return unsent

    def has_holds(self, request_id: str) -> bool:
        """Whether blocks of an abandoned attempt of `request_id` are still held: its
        worker may still write into them, and a new request under that id would take the
        same hold keys."""
        holds = [*self.scheduler.abandoned_remote, *self.unconfirmed.values()]
        return any(h.request_id == request_id and self.kv.is_held(h.key) for h in holds)

    def expire_holds(self, now: float) -> list[HoldExpiry]:
        """End the hold timeouts passed by `now`: a hold whose worker was lost is released,
        any other is quarantined (kept, and its abort still resent, until `release` or
        `writer_lost`)."""
        expired = []
        for key in [k for k, deadline in self.hold_deadlines.items() if now >= deadline]:
            del self.hold_deadlines[key]
            worker = self.unconfirmed[key].worker
            if key in self.lost:
                self.release(key)
                expired.append(HoldExpiry(key, worker, quarantined=False))
            else:
                self.quarantined.add(key)
                expired.append(HoldExpiry(key, worker, quarantined=True))
        return expired

    def writer_lost(self, worker: str) -> list[str]:
        """The control connection to `worker` dropped: nothing it posted can land any more.
        Its quarantined holds are released now (their keys returned); its other holds are
        released when their timeout passes, unless it confirms first."""
        holds = [*self.scheduler.abandoned_remote, *self.unconfirmed.values()]
        self.lost.update(h.key for h in holds if h.worker == worker)
        released = self.quarantined_by(worker)
        for key in released:
            self.release(key)
        return released

    def quarantined_by(self, worker: str) -> list[str]:
        """Keys of the quarantined holds whose writer is `worker`."""
        return sorted(k for k in self.quarantined if self.unconfirmed[k].worker == worker)

    def is_quarantined(self, key: str) -> bool:
        return key in self.quarantined

    @property
    def num_quarantined_blocks(self) -> int:
        return sum(self.kv.num_blocks_held(key) for key in self.quarantined)

    def release(self, key: str) -> None:
        """Nothing more lands in the attempt's blocks: give them back."""
        self.hold_deadlines.pop(key, None)
        self.unconfirmed.pop(key, None)
        self.quarantined.discard(key)
        self.lost.discard(key)
        self.kv.release(key)

    def next_due(self) -> float | None:
        """When the next deadline passes or the aborts are due again (None: nothing waits);
        for a driver that sleeps between events."""
        times = [self.attempts[r].deadline for r in self.scheduler.remote]
        times += self.hold_deadlines.values()
        if self.unconfirmed:
            times.append(self.next_resend)
        return min(times, default=None)
