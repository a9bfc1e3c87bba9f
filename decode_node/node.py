"""The decode node (`DecodeNode`): token-level requests in, records out, remote prefill between.

A request that names a prefill worker is admitted by the scheduler with blocks for its
whole prompt plus the first decode step (or waits in the queue until they fit); when its
uncached part reaches the threshold it is sent to that worker, and joins the decode batch
when the `PrefillDone` notification arrives (after the data). Failure policy: a deadline
or a failure report moves the request to the next prefill worker once, then prefills it
here (`recompute`) or fails it (`fail`), counted in `tandem_prefill_fallbacks_total` and
logged with the request id; so does a dropped connection to the worker, at once. Destination
blocks of an abandoned attempt stay held until the prefill worker confirms that nothing more
will land in them; past `hold_timeout_s` they are quarantined (still held, counted in
`tandem_kv_quarantined_blocks`) until it confirms or its connection drops (fencing,
docs/disaggregation.md); the abort is sent again every `ABORT_RESEND_S`
until then, so a worker that died and restarted (its successor never heard of the attempt,
and confirms at once) gives the blocks back as soon as it is up. The policy and the holds'
bookkeeping are `tandem.engine.transfer.prefill_failover.PrefillFailover`, which the
simulator runs too; this node drives it with the wall clock, ZMQ, metrics and spans, and
`Holds` (decode_node/holds.py) logs and counts what happens to each hold. A request's stream
and record format are in decode_node/stream.py.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import time
from typing import Any

import msgspec
from transformers import PreTrainedTokenizerBase

from tandem.decode_node.holds import Holds
from tandem.decode_node.prefill_client import PrefillClient
from tandem.decode_node.stream import GenerateInput, Sink, Stream, make_record
from tandem.engine.core.request import Request, RequestStatus
from tandem.engine.core.scheduler import (
    ModelRunnerOutput,
    RemoteHold,
    SchedulerOutput,
    remote_hold_key,
)
from tandem.engine.detokenizer import IncrementalDetokenizer
from tandem.engine.llm_engine import validate_prompt
from tandem.engine.step import StepHooks, run_step
from tandem.engine.telemetry import request_log, tracing
from tandem.engine.telemetry.tracing import Tracing
from tandem.engine.transfer.messages import (
    AbortAck,
    AbortPrefill,
    FromPrefill,
    PrefillDone,
    PrefillRequest,
    decode_done,
    from_wire,
)
from tandem.engine.transfer.prefill_failover import (
    ABORT_RESEND_S,
    DecodeOptions,
    PrefillFailover,
)
from tandem.node.core import NodeCore

logger = logging.getLogger(__name__)

# Re-exported: the CLI, the server and the tests name them here.
__all__ = ["ABORT_RESEND_S", "DecodeNode", "DecodeOptions", "DuplicateRequest", "GenerateInput"]


class DuplicateRequest(ValueError):
    """A request id still live on this node (the HTTP API answers 409 Conflict)."""


class DecodeNode(StepHooks):
    """Owns the streams and the holds; runs on the engine thread. Its hooks on the engine
    step send the remote prefills and stream the tokens."""

    def __init__(
        self,
        core: NodeCore,
        client: PrefillClient,
        tokenizer: PreTrainedTokenizerBase,
        options: DecodeOptions,
        traces: Tracing | None = None,
    ) -> None:
        self.core = core
        self.client = client
        self.tokenizer = tokenizer
        self.options = options
        self.traces = traces or Tracing.off()
        self.streams: dict[str, Stream] = {}
        self.failover = PrefillFailover(core.scheduler, options, self._send_abort)
        self.holds = Holds(self.failover, core)
        self._agent_info = core.agent.info()
        self._rank_agents = core.agent.rank_infos()

    # -- requests in ----------------------------------------------------------------------

    def add(self, inp: GenerateInput, sink: Sink) -> None:
        """Validate and queue; raises ValueError (nothing changed) for a bad request,
        DuplicateRequest for an id still live here."""
        self._check_new_id(inp.request_id)
        params = inp.sampling
        if params.n != 1:
            raise ValueError("n must be 1 at a decode node (the router fans out)")
        config = self.core.config
        validate_prompt(config, inp.token_ids, params)
        seed = params.seed if params.seed is not None else secrets.randbits(63)
        params = dataclasses.replace(params, seed=seed)
        request = Request(
            inp.request_id, inp.token_ids, params, config.model.eos_token_ids, inp.cache_salt
        )
        request.seed = seed
        if params.structured_outputs is not None:
            # Starts at the grammar's start: a prefill node's first token advances it.
            request.grammar = self.core.grammars.matcher(params.structured_outputs)
        request.prefill_worker = inp.prefill
        detok = IncrementalDetokenizer(
            self.tokenizer,
            inp.token_ids,
            params.skip_special_tokens,
            params.stop,
            params.include_stop_str_in_output,
        )
        stream = Stream(
            request,
            sink,
            detok,
            params,
            time.monotonic(),
            log_id=inp.log_id,
            span=self._request_span(inp),
        )
        self.streams[inp.request_id] = stream
        self.failover.track(request, inp.prefill_alternates)
        self.core.scheduler.add_request(request)
        with request_log.request_context(inp.log_id):
            logger.info(
                "request %s: queued, %d prompt tokens, prefill %s",
                inp.request_id, len(inp.token_ids), inp.prefill,
            )  # fmt: skip

    def _check_new_id(self, request_id: str) -> None:
        """DuplicateRequest if `request_id` has a stream here, or a hold whose blocks an
        abandoned attempt may still write (a new request would take its hold keys)."""
        if request_id in self.streams:
            detail = "is already in use"
        elif self.failover.has_holds(request_id):
            detail = "is already in use: an earlier request's blocks are still being written"
        else:
            return
        m = self.core.metrics
        m.child(m.refused_inputs, reason="duplicate_id").inc()
        raise DuplicateRequest(f"request id {request_id!r} {detail}")

    def _request_span(self, inp: GenerateInput) -> Any:
        """The request's span here, a child of the router's (None when tracing is off)."""
        attributes = {
            "tandem.request_id": inp.log_id,
            "tandem.choice_id": inp.request_id,
            "tandem.prompt_tokens": len(inp.token_ids),
        }
        return self.traces.start("tandem.decode.request", inp.trace, **attributes)

    def abort(self, request_id: str) -> bool:
        """Abort wherever the request is; False if it is unknown or already finished."""
        stream = self.streams.get(request_id)
        if stream is None:
            return False
        self.core.scheduler.finish_requests([request_id], RequestStatus.FINISHED_ABORTED)
        self._finish(stream)
        return True

    # -- the loop -------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        s = self.core.scheduler
        return bool(s.running) or (bool(s.waiting) and not s.remote)

    @property
    def waiting_remote(self) -> bool:
        """Writes may land: requests wait for KV, or holds (quarantined ones too) wait for
        their writer's confirmation."""
        return bool(self.core.scheduler.remote) or bool(self.failover.unconfirmed)

    def step(self) -> None:
        """Deadlines, then one engine step (`run_step`, with this node's hooks), then the
        aborts it made due."""
        self._check_deadlines()
        run_step(self.core.scheduler, self.core.execute, self)
        self.holds.send_aborts()
        m = self.core.metrics
        m.child(m.kv_quarantined).set(self.failover.num_quarantined_blocks)

    def before_run(self, out: SchedulerOutput) -> None:
        """The step's remote prefills go out; its requests count as admitted."""
        m = self.core.metrics
        if out.num_local_decisions:
            m.child(m.disagg_decisions, decision="local").inc(out.num_local_decisions)
        for request in out.remote_prefills:
            self._mark_admitted(request)
            if request.num_remote_attempts == 1:
                m.child(m.disagg_decisions, decision="remote").inc()
            self._send_prefill(request)
        for request in out.scheduled:
            self._mark_admitted(request)

    def after_update(
        self, out: SchedulerOutput, result: ModelRunnerOutput, finished: list[Request]
    ) -> None:
        """Each new token is recorded and streamed (finished requests too)."""
        for request, token in zip(out.scheduled, result.sampled_token_ids):
            if token is not None:
                self._on_token(self.streams[request.request_id])

    def on_notification(self, sender: str, data: bytes) -> None:
        """A prefill worker's `PrefillDone`; anything else is counted and dropped."""
        try:
            done = decode_done(data)
        except msgspec.DecodeError as exc:  # ValidationError too: not a PrefillDone
            logger.warning("undecodable notification from %s: %s", sender, exc)
            m = self.core.metrics
            m.child(m.refused_inputs, reason="undecodable").inc()
            return
        worker = self.failover.worker_of(done.request_id, done.attempt)
        if worker is not None and sender != self.client.agent_of(worker):
            self._refuse_foreign(f"notification from agent {sender[:80]}", done, worker)
            return
        if self.failover.current(done.request_id, done.attempt) is None:
            # a late attempt: every write of it has landed
            self.holds.release(remote_hold_key(done.request_id, done.attempt))
            return
        self._complete_remote(self.streams[done.request_id], done)

    def on_reply(self, endpoint: str, msg: FromPrefill) -> None:
        """An answer about an attempt, taken only from the worker the attempt went to."""
        worker = self.failover.worker_of(msg.request_id, msg.attempt)
        if worker is not None and worker != endpoint:
            self._refuse_foreign(f"reply from {endpoint}", msg, worker)
            return
        key = remote_hold_key(msg.request_id, msg.attempt)
        if isinstance(msg, AbortAck):
            self.holds.release(key)
            return
        if self.failover.current(msg.request_id, msg.attempt) is not None:
            stream = self.streams[msg.request_id]
            self._fall_back(stream, "error", f"{endpoint} failed it: {msg.reason}")
        self.holds.release(key)  # a failure report means no write is in flight

    def _refuse_foreign(self, source: str, msg: msgspec.Struct, worker: str) -> None:
        """Drop, log and count an answer about an attempt from anyone but the worker it
        went to (a paired worker answering for another's attempt, or a NIXL agent that is
        not that worker's). Answers about attempts nothing is expected of change nothing."""
        logger.warning(
            "%s about %s@%s dropped: the attempt went to %s",
            source, msg.request_id[:80], msg.attempt, worker,
        )  # fmt: skip
        m = self.core.metrics
        m.child(m.refused_inputs, reason="foreign").inc()

    def on_unsent(self, endpoint: str, msg: msgspec.Struct) -> None:
        """The client gave up sending `msg` (no connection came up in time): a request's
        attempt fails over as unreachable, and its blocks go back at once, since nothing of
        it was ever queued. An abort needs nothing: it is resent while unconfirmed."""
        if not isinstance(msg, PrefillRequest):
            return
        if self.failover.current(msg.request_id, msg.attempt) is not None:
            stream = self.streams[msg.request_id]
            self._fall_back(stream, "unreachable", f"{endpoint} did not connect")
        self.holds.release(remote_hold_key(msg.request_id, msg.attempt))

    def on_disconnect(self, endpoint: str) -> None:
        """The connection to a prefill worker dropped: every attempt waiting on it fails
        over now. Their holds stay until that worker (or its successor) confirms, or their
        timeout passes; its quarantined holds are released now: a process that lost its
        connection is taken for dead, and nothing it posted can land any more."""
        for request in self.failover.waiting_on(endpoint):
            stream = self.streams[request.request_id]
            self._fall_back(stream, "disconnected", f"lost the connection to {endpoint}")
        for key in self.failover.quarantined_by(endpoint):  # logged and counted, then gone
            self.holds.release(key, "writer_lost")
        self.failover.writer_lost(endpoint)

    # -- remote prefill -------------------------------------------------------------------

    def _send_prefill(self, request: Request) -> None:
        stream = self.streams[request.request_id]
        with request_log.request_context(stream.log_id):
            self._send_prefill_to(stream)

    def _send_prefill_to(self, stream: Stream) -> None:
        request = stream.request
        worker = request.prefill_worker
        msg = PrefillRequest(
            request_id=request.request_id,
            attempt=request.num_remote_attempts,
            token_ids=request.prompt_token_ids,
            sampling=stream.sampling,
            skip_blocks=request.num_remote_skip_blocks,
            dst_block_ids=self.core.scheduler.remote_destination(request),
            agent=self._agent_info,
            rank_agents=self._rank_agents,
            deadline_s=self.options.prefill_timeout_s,
            sent_at=time.time(),
            cache_salt=request.cache_salt,
            log_id=stream.log_id,
            trace=self._remote_span(stream, request, worker),
        )
        logger.info(
            "request %s: remote prefill attempt %d on %s", msg.request_id, msg.attempt, worker
        )
        if stream.log_id is not None:
            self.holds.log_ids[remote_hold_key(msg.request_id, msg.attempt)] = stream.log_id
        stream.sent = time.monotonic()
        self.failover.sent(request, stream.sent)
        if not self.client.send(worker, msg):
            self._fall_back(stream, "unreachable", f"{worker} is not connected")
            # Never queued (no connected peer): nothing of this attempt can land, so its
            # blocks need no hold until a confirmation that will never come.
            self.holds.release(remote_hold_key(msg.request_id, msg.attempt))

    def _remote_span(self, stream: Stream, request: Request, worker: str) -> dict[str, str]:
        """Start the attempt's span (its context goes to the prefill node)."""
        tracing.end(stream.remote_span)  # a previous attempt's, if it never ended
        stream.remote_span = self.traces.start(
            "tandem.decode.remote_prefill", tracing.carrier(stream.span),
            **{"tandem.request_id": stream.log_id, "tandem.attempt": request.num_remote_attempts,
               "tandem.prefill_worker": worker},
        )  # fmt: skip
        return tracing.carrier(stream.remote_span) or None

    def _complete_remote(self, stream: Stream, done: PrefillDone) -> None:
        request = stream.request
        if not self._first_token_valid(stream, done):
            return
        if done.src_heads:  # pieces from several prefill ranks, on some rank of ours
            destination = self.core.scheduler.remote_destination(request)
            try:
                self.core.agent.repack(destination, [tuple(h) for h in done.src_heads])
            except ValueError as exc:  # a prefill node whose heads do not cover ours
                self._fall_back(stream, "error", f"unusable KV heads: {exc}")
                return
        tracing.end(stream.remote_span, **{"tandem.kv_blocks": done.num_blocks})
        stream.remote_span = None
        self.holds.log_ids.pop(remote_hold_key(done.request_id, done.attempt), None)
        m = self.core.metrics
        m.child(m.transfer_seconds).observe(done.transfer_s)
        m.child(m.transfer_bytes).inc(done.num_bytes)
        m.child(m.transfer_blocks).inc(done.num_blocks)
        now = time.monotonic()
        stream.timings = {
            "queue_s": (stream.admitted or now) - stream.arrival,
            "remote_s": now - stream.sent,  # sent -> notification, on our clock
            "prefill_s": done.prefill_s,  # received -> first token, on the worker's clock
            "transfer_s": done.transfer_s,  # first write posted -> last write done
        }
        # The prefill node computed the prompt from its own prefix hits: usage counts both.
        request.num_cached_tokens = max(request.num_cached_tokens, done.num_cached_tokens)
        # The runner skips the draw of this token when it first meets the request.
        self.core.scheduler.complete_remote_prefill(
            request.request_id, done.token_id, from_wire(done.logprobs)
        )
        self._on_token(stream)

    def _first_token_valid(self, stream: Stream, done: PrefillDone) -> bool:
        """False (the attempt failed over, counted) for a first token outside the
        vocabulary: it must never reach the embedding. Every write of the attempt has
        landed, so its blocks are released at once."""
        vocab = self.core.config.model.vocab_size
        if 0 <= done.token_id < vocab:
            return True
        m = self.core.metrics
        m.child(m.refused_inputs, reason="first_token").inc()
        detail = f"first token {done.token_id} outside the vocabulary of {vocab}"
        self._fall_back(stream, "error", detail)
        self.holds.release(remote_hold_key(done.request_id, done.attempt))
        return False

    def _fall_back(self, stream: Stream, reason: str, detail: str) -> None:
        """Retry on another worker once, then recompute here or fail, per the policy."""
        with request_log.request_context(stream.log_id):
            self._fall_back_now(stream, reason, detail)

    def _fall_back_now(self, stream: Stream, reason: str, detail: str) -> None:
        request = stream.request
        tracing.end(stream.remote_span, **{"tandem.fallback": reason})
        stream.remote_span = None
        m = self.core.metrics
        m.child(m.prefill_fallbacks, reason=reason).inc()
        decision = self.failover.fall_back(request.request_id, reason)
        logger.warning(
            "request %s: remote prefill %s (%s); %s",
            request.request_id, reason, detail, decision.action,
        )  # fmt: skip
        if decision.failed:
            self._finish(
                stream, error=f"remote prefill failed ({reason}: {detail})", error_source="prefill"
            )

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        for request in self.failover.overdue(now):
            stream = self.streams[request.request_id]
            self._fall_back(stream, "timeout", f"no answer from {request.prefill_worker}")
        for expiry in self.failover.expire_holds(now):
            self.holds.expired(expiry)

    def _send_abort(self, hold: RemoteHold) -> bool:
        return self.client.send(
            hold.worker, AbortPrefill(hold.request_id, hold.attempt, self._agent_info.name)
        )

    # -- output ---------------------------------------------------------------------------

    def _mark_admitted(self, request: Request) -> None:
        stream = self.streams[request.request_id]
        if stream.admitted is None:
            stream.admitted = time.monotonic()
            m = self.core.metrics
            m.child(m.queue_time).observe(stream.admitted - stream.arrival)

    def _on_token(self, stream: Stream) -> None:
        """Record the token just appended; finish on a stop string; stream a record."""
        request = stream.request
        token = request.output_token_ids[-1]
        now = time.monotonic()
        m = self.core.metrics
        if stream.last_token is None:
            m.child(m.ttft).observe(now - stream.arrival)
        else:
            m.child(m.itl).observe(now - stream.last_token)
        stream.last_token = now
        m.child(m.generation_tokens).inc()
        if not request.ends_on_stop_token and stream.detok.update([token]) is not None:
            request.stop_reason = stream.detok.stopped_by
            if not request.is_finished:
                self.core.scheduler.finish_requests(
                    [request.request_id], RequestStatus.FINISHED_STOPPED
                )
            else:
                request.status = RequestStatus.FINISHED_STOPPED
        if request.is_finished:
            self._finish(stream, [token])
        else:
            stream.sink(make_record(stream, [token]))

    def _finish(
        self,
        stream: Stream,
        tokens: list[int] = (),
        error: str | None = None,
        error_source: str = "decode",
    ) -> None:
        """Send the final record (with `tokens`, not streamed yet) and forget the stream.
        An `error` names its `error_source`: "prefill" when the remote prefill failed and
        this node is sound (the router then keeps it in its pool)."""
        with request_log.request_context(stream.log_id):
            self._finish_now(stream, list(tokens), error, error_source)

    def _finish_now(
        self, stream: Stream, tokens: list[int], error: str | None, error_source: str
    ) -> None:
        request = stream.request
        del self.streams[request.request_id]
        self.failover.forget(request.request_id)
        stream.detok.flush()
        record = make_record(stream, list(tokens), finished=True)
        if error is not None:
            record["error"] = error
            record["error_source"] = error_source
        m = self.core.metrics
        m.child(m.e2e).observe(time.monotonic() - stream.arrival)
        m.child(m.request_success, finish_reason=record["finish_reason"]).inc()
        m.child(m.prompt_tokens).inc(request.num_prompt_tokens)
        logger.info(
            "request %s: finished (%s), %d tokens",
            request.request_id, record["finish_reason"], request.num_output_tokens,
        )  # fmt: skip
        tracing.end(stream.remote_span, **{"tandem.fallback": "request_ended"})
        tracing.end(
            stream.span, **{"tandem.finish_reason": record["finish_reason"], "tandem.error": error,
            "tandem.completion_tokens": request.num_output_tokens,
            "tandem.cached_tokens": request.num_cached_tokens},
        )  # fmt: skip
        stream.sink(record)
