"""The prefill node (`PrefillNode`): prompt-only continuous batches whose finished blocks are
pushed, chunk by chunk, into the blocks the decode node reserved.

Per request (a "job", keyed `request_id@attempt for <decode agent>`: the router retries a
failed request on another decode node under the same id, and that node numbers its attempts
from 1 again, so the attempt alone would collide with the dead node's): after every step the
blocks completed so far are written with one NIXL WRITE (one descriptor per run of adjacent
blocks), under a hold so the source blocks cannot be reused while the write is in flight.
When the last chunk is done the first token is sampled; once every write has completed, a
`PrefillDone` notification carries it to the decode node. An abort, a failed write or a
passed deadline end the job; the decode node hears of it (`AbortAck`, `PrefillFailed`) only
when no write of the job is in flight any more, so it may then reuse its blocks.

Nothing polls the writes while a step runs, so before a step a worker first polls a
finished job's last writes for a bounded time (`LAST_WRITE_WAIT_SHARE` of a step): its
`PrefillDone` goes out when they land, not after that step.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from tandem.engine.core.config import LAST_WRITE_WAIT_SHARE
from tandem.engine.core.request import Request, RequestStatus
from tandem.engine.core.scheduler import ModelRunnerOutput, SchedulerOutput, prefill_job_key
from tandem.engine.core.step_event import StepEvent
from tandem.engine.step import StepHooks, run_step
from tandem.engine.telemetry import request_log, tracing
from tandem.engine.telemetry.tracing import Tracing
from tandem.engine.transfer.messages import (
    AbortAck,
    AbortPrefill,
    KVLayout,
    PrefillDone,
    PrefillFailed,
    PrefillRequest,
    encode,
    to_wire,
)
from tandem.engine.transfer.nixl_agent import Transfer
from tandem.node.core import NodeCore

logger = logging.getLogger(__name__)

_LAST_WRITE_POLL_S = 1e-4  # between polls while waiting: lets the HTTP thread run

Reply = Callable[[bytes, msgspec.Struct], None]


_MAX_DETAIL = 200  # characters of an error kept in a reply: the message is untrusted


class PeerRefused(Exception):
    """The transfer agent rejected a decode node's agent metadata."""


def _refusal_reason(exc: Exception) -> str:
    """The `reason` label of `tandem_refused_inputs_total` for why `_make_request` failed."""
    if isinstance(exc, PeerRefused):
        return "peer"
    return "invalid" if isinstance(exc, (ValueError, TypeError)) else "error"


@dataclass
class PrefillJob:
    msg: PrefillRequest
    peer: bytes  # the ZMQ identity to answer
    request: Request
    deadline: float  # monotonic; no write starts after it
    received: float
    num_posted: int  # prompt blocks posted so far (starts at skip_blocks)
    transfers: list[tuple[Transfer, str]] = field(default_factory=list)  # (write, hold key)
    done: PrefillDone | None = None
    ended: str | None = None  # "abort" or a failure reason
    first_write: float | None = None
    scheduled: bool = False
    waited: bool = False  # a step already waited for its last writes: never again
    span: Any = None  # the job's span and its KV transfer's (None when tracing is off)
    transfer_span: Any = None

    @property
    def key(self) -> str:
        return self.request.request_id


class PrefillNode(StepHooks):
    """Owns the jobs; `reply` sends a control message to a decode node's ZMQ identity. Its
    hooks on the engine step post the KV writes and ready each finished job's answer."""

    def __init__(self, core: NodeCore, reply: Reply, traces: Tracing | None = None) -> None:
        self.core = core
        self.reply = reply
        self.traces = traces or Tracing.off()
        self.jobs: dict[str, PrefillJob] = {}
        self._xfers = 0
        self.last_step_s = 0.0  # wall time of the last step that ran a batch
        self._unposted: dict[str, str] = {}  # this step's jobs that could not post: why

    # -- messages -------------------------------------------------------------------------

    def submit(self, peer: bytes, msg: PrefillRequest) -> None:
        with request_log.request_context(msg.log_id):
            self._submit(peer, msg)

    def _submit(self, peer: bytes, msg: PrefillRequest) -> None:
        key = prefill_job_key(msg.agent.name, msg.request_id, msg.attempt)
        try:
            request = self._make_request(key, msg)
        except Exception as exc:  # one bad message is refused; none may stop the node
            self._refuse(peer, msg, key, exc)
            return
        now = time.monotonic()
        job = PrefillJob(msg, peer, request, now + msg.deadline_s, now, msg.skip_blocks)
        job.span = self.traces.start(
            "tandem.prefill.request", msg.trace, **{"tandem.request_id": msg.log_id,
            "tandem.choice_id": msg.request_id, "tandem.attempt": msg.attempt,
            "tandem.prompt_tokens": len(msg.token_ids)},
        )  # fmt: skip
        self.jobs[key] = job
        self.core.scheduler.add_request(request)
        logger.info(
            "prefill %s: received, %d tokens, %d blocks to write",
            key, len(msg.token_ids), len(msg.dst_block_ids),
        )  # fmt: skip

    def abort(self, peer: bytes, msg: AbortPrefill) -> None:
        """End the aborting decode node's job (not another node's with the same attempt);
        an unknown one is confirmed at once (it ended, or this worker restarted)."""
        job = self.jobs.get(prefill_job_key(msg.agent, msg.request_id, msg.attempt))
        if job is None:
            self.reply(peer, AbortAck(msg.request_id, msg.attempt))
            return
        # Answer where the abort came from: a decode node that reconnected has a new ZMQ
        # identity, and the one its request came from is gone.
        job.peer = peer
        self._end(job, "abort")

    def _refuse(self, peer: bytes, msg: PrefillRequest, key: str, exc: Exception) -> None:
        """Answer a request `_make_request` refused, and count it by reason. Nothing of it
        was taken yet: no job, no block."""
        reason = _refusal_reason(exc)
        detail = str(exc)[:_MAX_DETAIL]
        logger.warning("prefill %s refused (%s): %s", key, reason, detail)
        m = self.core.metrics
        m.child(m.refused_inputs, reason=reason).inc()
        self.reply(peer, PrefillFailed(msg.request_id, msg.attempt, f"{reason}: {detail}"))

    def _make_request(self, key: str, msg: PrefillRequest) -> Request:
        """Validate the message against our model and the decode node's layout. Raises
        ValueError or TypeError for a malformed message, PeerRefused when the transfer
        agent rejects the decode node's."""
        if key in self.jobs:
            raise ValueError(f"{key} is already being prefilled")
        if time.time() - msg.sent_at > msg.deadline_s:
            raise ValueError("expired before it arrived")
        core = self.core
        # one token (EOS still barred when min_tokens asks for one), and no stop strings:
        # the decode node checks them on the whole text
        min_tokens = min(msg.sampling.min_tokens, 1)
        params = dataclasses.replace(
            msg.sampling, n=1, max_tokens=1, min_tokens=min_tokens, stop=None
        )
        remote = self._connect(msg)
        num_tokens = len(msg.token_ids)
        max_len = core.config.scheduler.max_model_len
        vocab = core.config.model.vocab_size
        if not 0 < num_tokens <= max_len:
            raise ValueError(f"prompt of {num_tokens} tokens (max_model_len {max_len})")
        if min(msg.token_ids) < 0 or max(msg.token_ids) >= vocab:
            raise ValueError(f"token ids must be in [0, {vocab})")
        num_blocks = core.kv.num_blocks_needed(num_tokens)
        if not 0 <= msg.skip_blocks < num_blocks:
            raise ValueError(f"skip_blocks {msg.skip_blocks} for {num_blocks} prompt blocks")
        if len(msg.dst_block_ids) != num_blocks - msg.skip_blocks:
            raise ValueError(
                f"{len(msg.dst_block_ids)} destination blocks, expected "
                f"{num_blocks - msg.skip_blocks}"
            )
        if not all(0 <= b < remote.num_blocks for b in msg.dst_block_ids):
            raise ValueError("destination block id out of range")
        if num_blocks > core.kv.num_blocks:
            raise ValueError(f"the prompt needs {num_blocks} blocks, we have {core.kv.num_blocks}")
        request = Request(
            key, msg.token_ids, params, core.config.model.eos_token_ids, msg.cache_salt
        )
        request.seed = params.seed if params.seed is not None else secrets.randbits(63)
        if params.structured_outputs is not None:
            # the first token obeys the grammar too; D's matcher starts from the prompt
            request.grammar = core.grammars.matcher(params.structured_outputs)
        return request

    def _connect(self, msg: PrefillRequest) -> KVLayout:
        """Add the decode node's agents (and ranks); its KV layout. PeerRefused for
        whatever the transfer agent raises (NIXL has its own exception types)."""
        agent = self.core.agent
        try:
            agent.connect(msg.agent, msg.rank_agents)
            agent.check_peer(msg.agent.name)
            return agent.remote_layout(msg.agent.name)
        except Exception as exc:
            raise PeerRefused(str(exc)) from exc

    # -- the loop -------------------------------------------------------------------------

    def step(self) -> None:
        """Expire late jobs, run one engine step (`run_step`, with this node's hooks). When
        a batch is due, finished jobs' last writes get a bounded time to land first
        (`_finish_writes`)."""
        self._expire()
        if self.busy:
            self._finish_writes()
        start = time.monotonic()
        if run_step(self.core.scheduler, self.core.execute, self):
            self.last_step_s = time.monotonic() - start

    def before_run(self, out: SchedulerOutput) -> None:
        """Queue time, counted when a job's request is first scheduled."""
        for request in out.scheduled:
            job = self.jobs[request.request_id]
            if not job.scheduled:
                job.scheduled = True
                m = self.core.metrics
                m.child(m.queue_time).observe(time.monotonic() - job.received)

    def before_update(self, out: SchedulerOutput, result: ModelRunnerOutput) -> None:
        """Post the writes the step made possible: before the update, which frees a
        finished request's blocks. A job that cannot post ends after it (`after_update`),
        since the batch still holds its request until then."""
        self._unposted = self._post_writes(out, result.kv_written)

    def after_update(
        self, out: SchedulerOutput, result: ModelRunnerOutput, finished: list[Request]
    ) -> None:
        """Finished jobs get their `PrefillDone`; those that could not post end."""
        failed, self._unposted = self._unposted, {}
        for request in finished:
            job = self.jobs[request.request_id]
            if job.ended is None and job.key not in failed:
                job.done = self._done_message(job)
        for key, reason in failed.items():
            self._end(self.jobs[key], reason)

    def _post_writes(self, out: SchedulerOutput, kv_written: StepEvent) -> dict[str, str]:
        """Post the writes this step made possible, once its kernels wrote the KV;
        {job key: why it must end} for the jobs that could not post."""
        failed = {}
        for request, n in zip(out.scheduled, out.num_scheduled_tokens):
            job = self.jobs[request.request_id]
            with request_log.request_context(job.msg.log_id):
                reason = self._post_ready(job, request.num_computed_tokens + n, kv_written)
            if reason is not None:
                failed[job.key] = reason
        return failed

    def poll(self) -> None:
        """Advance in-flight writes; settle every job with none left."""
        for job in list(self.jobs.values()):
            with request_log.request_context(job.msg.log_id):
                self._poll_job(job)

    def _finish_writes(self) -> None:
        """Before a step: while a job that has its first token still has writes in flight,
        poll (which drives NIXL's progress) until they land or `LAST_WRITE_WAIT_SHARE` of
        the last step has passed. Nothing polls during a step, so its `PrefillDone` would
        otherwise wait for the whole step. A job is waited for once: a write that does not
        land within the bound does not hold every later step too."""
        waiting = self._finishing()
        if not waiting:
            return
        start = time.monotonic()
        deadline = start + LAST_WRITE_WAIT_SHARE * self.last_step_s
        while True:  # at least once: a write that was in flight may be done by now
            self.poll()
            if not self._finishing() or time.monotonic() >= deadline:
                break
            time.sleep(_LAST_WRITE_POLL_S)
        for job in waiting:
            job.waited = True
        self.core.steps.writes_waited(time.monotonic() - start)

    def _finishing(self) -> list[PrefillJob]:
        """The jobs that have their first token, wait only for their writes, and have not
        been waited for yet."""
        jobs = self.jobs.values()
        return [j for j in jobs if j.done is not None and j.transfers and not j.waited]

    def _poll_job(self, job: PrefillJob) -> None:
        for transfer, hold in list(job.transfers):
            state = self.core.agent.poll(transfer)
            if state == "PROC":
                continue
            job.transfers.remove((transfer, hold))
            self.core.kv.release(hold)
            self._account(transfer, job)
        if not job.transfers:
            self._settle(job)

    def report(self) -> dict[str, dict[str, object]]:
        """Each job's state, for /debug/kv: how it ended (or None) and writes in flight."""
        return {
            key: {"ended": job.ended, "done": job.done is not None, "writes": len(job.transfers)}
            for key, job in self.jobs.items()
        }

    @property
    def busy(self) -> bool:
        """A step has work now (a request loading from a lower KV tier waits, not spins)."""
        s = self.core.scheduler
        return bool(s.running or s.waiting)

    def _post_ready(self, job: PrefillJob, num_computed: int, kv_written: StepEvent) -> str | None:
        """Write the blocks the request has completed and not yet posted, after waiting for
        the step that computed them. Returns why the job must end instead (its deadline
        passed, or the write could not be posted)."""
        if job.ended is not None:
            return None
        kv = self.core.kv
        ready = kv.num_ready_blocks(job.request.num_prompt_tokens, num_computed)
        if ready <= job.num_posted:
            return None
        if time.monotonic() > job.deadline:
            return "deadline"
        start, skip = job.num_posted, job.msg.skip_blocks
        src = kv.block_ids(job.key)[start:ready]
        dst = job.msg.dst_block_ids[start - skip : ready - skip]
        self._xfers += 1
        hold = f"{job.key}#w{self._xfers}"
        kv.hold(hold, job.key, start, ready)
        kv_written.wait()  # NIXL reads the blocks now, outside the device's stream order
        try:
            transfer = self.core.agent.write_blocks(job.msg.agent.name, src, dst)
        except Exception as exc:  # NIXL raises when the remote agent is unreachable
            kv.release(hold)
            logger.warning("prefill %s: write failed: %s", job.key, exc)
            self.core.metrics.child(self.core.metrics.transfer_failures, reason="post").inc()
            return "transfer"
        if job.first_write is None:
            job.first_write = transfer.started
            job.transfer_span = self.traces.start(
                "tandem.prefill.kv_transfer", tracing.carrier(job.span),
                **{"tandem.request_id": job.msg.log_id},
            )  # fmt: skip
        job.num_posted = ready
        job.transfers.append((transfer, hold))
        return None

    def _account(self, transfer: Transfer, job: PrefillJob) -> None:
        m = self.core.metrics
        if transfer.state == "DONE":
            m.child(m.transfer_seconds).observe(time.monotonic() - transfer.started)
            m.child(m.transfer_bytes).inc(transfer.num_bytes)
            m.child(m.transfer_blocks).inc(transfer.num_blocks)
            return
        logger.warning("prefill %s: a write of %d blocks failed", job.key, transfer.num_blocks)
        m.child(m.transfer_failures, reason="write").inc()
        if job.ended is None:
            self._end(job, "transfer")

    def _end(self, job: PrefillJob, reason: str) -> None:
        """Stop a job: its request leaves the batch now; the decode node hears once no write
        is in flight (see `_settle`)."""
        if job.ended is None:
            job.ended = reason
            job.done = None
            self.core.scheduler.finish_requests([job.key], RequestStatus.FINISHED_ABORTED)

    def _settle(self, job: PrefillJob) -> None:
        msg = job.msg
        if job.ended == "abort":
            self.reply(job.peer, AbortAck(msg.request_id, msg.attempt))
        elif job.ended is not None:
            self.reply(job.peer, PrefillFailed(msg.request_id, msg.attempt, job.ended))
        elif job.done is not None:
            done = msgspec.structs.replace(
                job.done, transfer_s=time.monotonic() - (job.first_write or time.monotonic())
            )
            try:
                self.core.agent.notify(msg.agent.name, encode(done))
                logger.info("prefill %s: done, %d blocks written", job.key, done.num_blocks)
            except Exception as exc:  # NIXL raises when the remote agent is unreachable
                # Every write has landed, so the decode node may reuse its blocks: tell it
                # now rather than let it wait out its prefill deadline.
                logger.warning("prefill %s: notification failed: %s", job.key, exc)
                self.core.metrics.child(self.core.metrics.transfer_failures, reason="notify").inc()
                self.reply(job.peer, PrefillFailed(msg.request_id, msg.attempt, "notify"))
        else:
            return  # still computing
        tracing.end(job.transfer_span, **{"tandem.kv_blocks": len(msg.dst_block_ids)})
        tracing.end(job.span, **{"tandem.outcome": job.ended or "done"})
        del self.jobs[job.key]

    def _expire(self) -> None:
        now = time.monotonic()
        for job in list(self.jobs.values()):
            if job.ended is None and job.done is None and now > job.deadline:
                with request_log.request_context(job.msg.log_id):
                    logger.warning(
                        "prefill %s: deadline passed before the prompt was done", job.key
                    )
                self._end(job, "deadline")

    def _done_message(self, job: PrefillJob) -> PrefillDone:
        request = job.request
        self.core.metrics.child(self.core.metrics.prompt_tokens).inc(request.num_prompt_tokens)
        lp = request.output_logprobs[0] if request.output_logprobs else None
        num_blocks = len(job.msg.dst_block_ids)
        return PrefillDone(
            request_id=job.msg.request_id,
            attempt=job.msg.attempt,
            token_id=request.output_token_ids[0],
            logprobs=to_wire(lp),
            num_blocks=num_blocks,
            num_bytes=num_blocks * self.core.agent.node_block_bytes,
            transfer_s=0.0,
            prefill_s=time.monotonic() - job.received,
            src_heads=self.core.agent.head_ranges(),
            num_cached_tokens=request.num_cached_tokens,
        )
