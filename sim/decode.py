"""A simulated decode node: the real scheduler's remote-prefill decision (threshold, all or
nothing reservation, destination blocks), continuous-batched decode, and the fail-over
policy of `DecodeWorker` with `DecodeOptions`' settings (`FailoverOptions`).

As `DecodeWorker` does: a prefill deadline (`prefill_timeout_s`), a failure report or a
dropped connection moves the request to an untried alternate worker once, then prefills it
here (`recompute`) or fails it (`fail`), through the scheduler's `retry_remote` and
`finish_requests`; a send to a worker whose connection is down falls back at once
(`unreachable`). The destination blocks of an abandoned attempt stay held until its worker
confirms (`AbortAck`, a failure report, or the late notification) or `hold_timeout_s`
passes; unconfirmed aborts are sent again every `ABORT_RESEND_S`. A client's abort ends the
request wherever it is (`finish_requests`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tandem.engine.request import Request, RequestStatus
from tandem.engine.scheduler import RemoteHold, SchedulerOutput, remote_hold_key
from tandem.sim.failover import ABORT_RESEND_S, FailoverOptions
from tandem.sim.node import SimNode

if TYPE_CHECKING:
    from tandem.sim.prefill import SimPrefill


@dataclass(frozen=True)
class RemotePrefill:
    """What a decode node sends a prefill worker (`PrefillRequest`'s fields that matter)."""

    request_id: str
    attempt: int
    token_ids: list[int]
    block_hashes: list[int]
    skip_blocks: int
    dst_block_ids: list[int]
    decode: SimDecode
    sent_s: float
    deadline_s: float


@dataclass
class Stream:
    """The decode node's state of one request beside the scheduler's (`Stream` in
    `decode_node/worker.py`): the prefill workers it may use and those it tried."""

    request: Request
    alternates: list[str]
    tried: list[str] = field(default_factory=list)


class SimDecode(SimNode):
    options: FailoverOptions

    def setup_failover(self, options: FailoverOptions) -> None:
        self.options = options
        self.streams: dict[str, Stream] = {}
        self.down: set[str] = set()  # prefill endpoints whose connection dropped
        self.hold_deadlines: dict[str, float] = {}
        self.unconfirmed: dict[str, RemoteHold] = {}
        self.fallbacks: Counter[str] = Counter()
        self._resend_armed = False

    def add_stream(self, request: Request, alternates: list[str]) -> None:
        others = [a for a in alternates if a != request.prefill_worker]
        self.streams[request.request_id] = Stream(request, others)
        self.add(request)

    # -- the step -------------------------------------------------------------------------

    def before_run(self, out: SchedulerOutput) -> None:
        for request in out.scheduled:
            self.cluster.on_admitted(request, remote=False)
        for request in out.remote_prefills:
            self.cluster.on_admitted(request, remote=True)
            self._send_prefill(request)
        self._send_aborts()

    def after_update(
        self, out: SchedulerOutput, sampled: list[int | None], finished: list[Request]
    ) -> None:
        for request, token in zip(out.scheduled, sampled):
            if token is not None:
                self._on_token(request)

    def _on_token(self, request: Request) -> None:
        self.cluster.on_token(request)
        if request.is_finished:
            del self.streams[request.request_id]

    # -- remote prefill -------------------------------------------------------------------

    def _send_prefill(self, request: Request) -> None:
        stream = self.streams[request.request_id]
        worker = request.prefill_worker
        stream.tried.append(worker)
        attempt = request.num_remote_attempts
        now = self.cluster.events.now
        msg = RemotePrefill(
            request.request_id,
            attempt,
            request.prompt_token_ids,
            request.block_hashes,
            request.num_remote_skip_blocks,
            list(self.scheduler.remote_destination(request)),
            self,
            now,
            self.options.prefill_timeout_s,
        )
        if not self._send(worker, "submit", msg):
            self._fall_back(request.request_id, "unreachable")
            # never queued: nothing of this attempt can land, its blocks need no hold
            self._release_hold(remote_hold_key(request.request_id, attempt))
            return
        deadline = now + self.options.prefill_timeout_s
        self.cluster.events.at(deadline, self.deliver, self._deadline, request.request_id, attempt)

    def _send(self, endpoint: str, handler: str, *args: object) -> bool:
        """As `PrefillClient.send`: False when the connection is known to be down. A message
        to a worker that died before we heard of it is lost (the disconnect follows)."""
        if endpoint in self.down:
            return False
        prefill: SimPrefill = self.cluster.prefill_at(endpoint)
        self.cluster.send(prefill.deliver, getattr(prefill, handler), *args)
        return True

    def on_prefill_done(self, request_id: str, attempt: int, token_id: int) -> None:
        """The prefill worker's notification (after its last write landed)."""
        request = self.scheduler.remote.get(request_id)
        if request is None or request.num_remote_attempts != attempt:
            self._release_hold(remote_hold_key(request_id, attempt))  # a late attempt
            return
        self.scheduler.complete_remote_prefill(request_id, token_id, None)
        self._on_token(request)
        self.poke()

    def on_reply(self, request_id: str, attempt: int, failure: str | None) -> None:
        """`AbortAck` (failure None) or `PrefillFailed`: nothing of the attempt is in flight."""
        request = self.scheduler.remote.get(request_id)
        if failure is not None and request is not None and request.num_remote_attempts == attempt:
            self._fall_back(request_id, "error")
        self._release_hold(remote_hold_key(request_id, attempt))
        self.poke()

    def on_disconnect(self, endpoint: str) -> None:
        self.down.add(endpoint)
        for request in list(self.scheduler.remote.values()):
            if request.prefill_worker == endpoint:
                self._fall_back(request.request_id, "disconnected")
        self.poke()

    def on_connect(self, endpoint: str) -> None:
        self.down.discard(endpoint)

    def _deadline(self, request_id: str, attempt: int) -> None:
        request = self.scheduler.remote.get(request_id)
        if request is not None and request.num_remote_attempts == attempt:
            self._fall_back(request_id, "timeout")
            self.poke()

    def _fall_back(self, request_id: str, reason: str) -> None:
        """Retry on another worker once, then recompute here or fail, per the policy."""
        self.fallbacks[reason] += 1
        stream = self.streams[request_id]
        untried = [w for w in stream.alternates if w not in stream.tried]
        retry = len(stream.tried) < 2 and bool(untried)
        recompute = not retry and self.options.on_prefill_failure == "recompute"
        self.cluster.on_fallback(request_id, reason, local=recompute)
        if retry or recompute:
            self.scheduler.retry_remote(request_id, untried[0] if retry else None)
            return
        self.scheduler.finish_requests([request_id], RequestStatus.FINISHED_ERROR)
        self._end(request_id, "error")

    # -- holds of abandoned attempts ------------------------------------------------------

    def _send_aborts(self) -> None:
        now = self.cluster.events.now
        for hold in self.scheduler.abandoned_remote:
            if not self.kv.is_held(hold.key):
                continue  # released already: the worker said nothing is in flight
            deadline = now + self.options.hold_timeout_s
            self.hold_deadlines[hold.key] = deadline
            self.unconfirmed[hold.key] = hold
            self.cluster.events.at(deadline, self.deliver, self._hold_expired, hold.key, deadline)
            self._send(hold.worker, "abort", self, hold.request_id, hold.attempt)
        self.scheduler.abandoned_remote.clear()
        if self.unconfirmed and not self._resend_armed:
            self._resend_armed = True
            self.cluster.events.after(ABORT_RESEND_S, self.deliver, self._resend_aborts)

    def _resend_aborts(self) -> None:
        self._resend_armed = False
        for hold in list(self.unconfirmed.values()):
            self._send(hold.worker, "abort", self, hold.request_id, hold.attempt)
        self._send_aborts()  # re-arms while any is unconfirmed

    def _hold_expired(self, key: str, deadline: float) -> None:
        if self.hold_deadlines.get(key) == deadline:
            self._release_hold(key)
            self.cluster.num_hold_timeouts += 1
            self.poke()

    def _release_hold(self, key: str) -> None:
        self.hold_deadlines.pop(key, None)
        self.unconfirmed.pop(key, None)
        self.kv.release(key)

    # -- the client -----------------------------------------------------------------------

    def abort(self, request_id: str) -> None:
        """The router's `POST /abort`: end the request wherever it is (unknown: ignored)."""
        if request_id not in self.streams:
            return
        self.scheduler.finish_requests([request_id], RequestStatus.FINISHED_ABORTED)
        self._end(request_id, "aborted")
        self.poke()

    def _end(self, request_id: str, outcome: str) -> None:
        del self.streams[request_id]
        self.cluster.on_end(request_id, outcome)
