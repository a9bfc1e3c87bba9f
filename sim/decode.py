"""A simulated decode node: the real scheduler's remote-prefill decision (threshold, all or
nothing reservation, destination blocks), continuous-batched decode, and the decode node's
real fail-over code, `tandem.engine.transfer.prefill_failover.PrefillFailover` with `DecodeOptions`,
the object `DecodeNode` drives.

This node drives it as `DecodeNode` does, on the simulated clock: before each step the
prefill deadlines and hold timeouts (`overdue`, `expire_holds`), after scheduling the
remote prefills sent and the aborts (`send_aborts`); a failure report or a dropped
connection falls back at once (`fall_back`), and so does a send to a worker whose
connection is down (`unreachable`); a confirmation (`AbortAck`, a failure report, the late
notification) releases the hold. Between steps the node sleeps, so it also wakes itself at
the policy's `next_due` time. A client's abort ends the request wherever it is
(`finish_requests`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tandem.engine.core.request import Request, RequestStatus
from tandem.engine.core.scheduler import (
    ModelRunnerOutput,
    RemoteHold,
    SchedulerOutput,
    remote_hold_key,
)
from tandem.engine.transfer.prefill_failover import DecodeOptions, PrefillFailover
from tandem.sim.host_process import HostProcess
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


class SimDecode(SimNode):
    failover: PrefillFailover

    def setup_failover(self, options: DecodeOptions) -> None:
        self.failover = PrefillFailover(self.scheduler, options, self._send_abort)
        # the node's HTTP thread: a request reaches the engine after its work there, which
        # takes turns with the engine's steps (one process, one interpreter lock)
        self.front = HostProcess(self.cluster.cores, process=self)
        self.streams: dict[str, Request] = {}  # the requests not ended yet
        self.down: set[str] = set()  # prefill endpoints whose connection dropped
        self.fallbacks: Counter[str] = Counter()
        self._wake_at: float | None = None  # the wake-up armed for `failover.next_due`
        # request id -> (admitted, sent): the current remote attempt's times, for `timings`
        self._remote_times: dict[str, tuple[float, float]] = {}

    def add_stream(self, request: Request, alternates: list[str]) -> None:
        request.arrival_time = self.cluster.events.now  # reached the engine, as a `Stream`
        self.streams[request.request_id] = request
        self.failover.track(request, alternates)
        self.add(request)

    # -- the step -------------------------------------------------------------------------

    def before_schedule(self) -> None:
        self._check_deadlines()

    def before_run(self, out: SchedulerOutput) -> None:
        for request in out.scheduled:
            self.cluster.on_admitted(request, remote=False)
        for request in out.remote_prefills:
            self.cluster.on_admitted(request, remote=True)
            self._send_prefill(request)
        self.failover.send_aborts(self.cluster.events.now)
        self._arm()

    def after_update(
        self, out: SchedulerOutput, result: ModelRunnerOutput, finished: list[Request]
    ) -> None:
        made = [r for r, token in zip(out.scheduled, result.sampled_token_ids) if token is not None]
        for request in made:
            self._on_token(request)
        self.cluster.relay(made)

    def _on_token(self, request: Request) -> None:
        """A token leaves for the router (`Cluster.relay` carries the step's tokens)."""
        if request.is_finished:
            del self.streams[request.request_id]
            self.failover.forget(request.request_id)
            self._remote_times.pop(request.request_id, None)

    # -- deadlines ------------------------------------------------------------------------

    def _check_deadlines(self) -> None:
        now = self.cluster.events.now
        for request in self.failover.overdue(now):
            self._fall_back(request.request_id, "timeout")
        for _ in self.failover.expire_holds(now):  # released, or quarantined
            self.cluster.num_hold_timeouts += 1

    def _arm(self) -> None:
        """Wake at the policy's next deadline or abort resend, unless woken earlier."""
        due = self.failover.next_due()
        if due is None or (self._wake_at is not None and self._wake_at <= due):
            return
        self._wake_at = due = max(due, self.cluster.events.now)
        self.cluster.events.at(due, self.deliver, self._wake, due)

    def _wake(self, due: float) -> None:
        if self._wake_at != due:
            return  # an earlier wake-up replaced this one
        self._wake_at = None
        self._check_deadlines()
        self.failover.send_aborts(self.cluster.events.now)
        self._arm()
        self.poke()

    # -- remote prefill -------------------------------------------------------------------

    def _send_prefill(self, request: Request) -> None:
        worker = request.prefill_worker
        attempt = request.num_remote_attempts
        now = self.cluster.events.now
        self.failover.sent(request, now)
        admitted = self._remote_times.get(request.request_id, (now, now))[0]
        self._remote_times[request.request_id] = (admitted, now)
        msg = RemotePrefill(
            request.request_id,
            attempt,
            request.prompt_token_ids,
            request.block_hashes,
            request.num_remote_skip_blocks,
            list(self.scheduler.remote_destination(request)),
            self,
            now,
            self.failover.options.prefill_timeout_s,
        )
        if not self._send(worker, "submit", msg):
            self._fall_back(request.request_id, "unreachable")
            # never queued: nothing of this attempt can land, its blocks need no hold
            self.failover.release(remote_hold_key(request.request_id, attempt))

    def _send(self, endpoint: str, handler: str, *args: object) -> bool:
        """As `PrefillClient.send`: False when the connection is known to be down. A message
        to a worker that died before we heard of it is lost (the disconnect follows)."""
        if endpoint in self.down:
            return False
        prefill: SimPrefill = self.cluster.prefill_at(endpoint)
        self.cluster.send(prefill.deliver, getattr(prefill, handler), *args)
        return True

    def _send_abort(self, hold: RemoteHold) -> bool:
        return self._send(hold.worker, "abort", self, hold.request_id, hold.attempt)

    def on_prefill_done(
        self, request_id: str, attempt: int, token_id: int, prefill_s: float
    ) -> None:
        """The prefill worker's notification (after its last write landed); `prefill_s`:
        its time from receiving the request to sampling the first token."""
        request = self.failover.current(request_id, attempt)
        if request is None:
            self.failover.release(remote_hold_key(request_id, attempt))  # a late attempt
            return
        self.scheduler.complete_remote_prefill(request_id, token_id, None)
        admitted, sent = self._remote_times[request_id]
        now = self.cluster.events.now
        self.cluster.on_timings(request, {  # as `DecodeNode` puts them on the first record
            "queue_s": admitted - request.arrival_time,
            "remote_s": now - sent,
            "prefill_s": prefill_s,
        })  # fmt: skip
        self._on_token(request)
        self.cluster.relay([request])
        self.poke()

    def on_reply(self, request_id: str, attempt: int, failure: str | None) -> None:
        """`AbortAck` (failure None) or `PrefillFailed`: nothing of the attempt is in flight."""
        if failure is not None and self.failover.current(request_id, attempt) is not None:
            self._fall_back(request_id, "error")
        self.failover.release(remote_hold_key(request_id, attempt))
        self.poke()

    def on_disconnect(self, endpoint: str) -> None:
        self.down.add(endpoint)
        for request in self.failover.waiting_on(endpoint):
            self._fall_back(request.request_id, "disconnected")
        self.failover.writer_lost(endpoint)  # its quarantined holds come back now
        self.poke()

    def on_connect(self, endpoint: str) -> None:
        self.down.discard(endpoint)

    def _fall_back(self, request_id: str, reason: str) -> None:
        """The policy's decision, counted as `tandem_prefill_fallbacks_total` counts it."""
        self.fallbacks[reason] += 1
        decision = self.failover.fall_back(request_id, reason)
        self.cluster.on_fallback(request_id, reason, local=decision.local)
        if decision.failed:
            self._end(request_id, "error")

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
        self.failover.forget(request_id)
        self._remote_times.pop(request_id, None)
        self.cluster.on_end(self, request_id, outcome)
