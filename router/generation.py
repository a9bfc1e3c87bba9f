"""One OpenAI generation request end to end: its choices run concurrently on decode
workers, and the answer is either one JSON object or a Server-Sent Events stream of chunks
ending with `data: [DONE]`.

A streamed request is answered with an error status (not a stream) when its first record
cannot be had (no worker, a bad request found by the worker); a failure after that ends
the stream with an error event, a fault of the router's own too (then `data: [DONE]`,
always). A client that goes away aborts every choice downstream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request as HttpRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse

from tandem.engine.telemetry import request_log, tracing
from tandem.engine.telemetry.tracing import Tracing
from tandem.router.cpu_pool import CpuPool
from tandem.router.dispatch import Dispatcher, Job
from tandem.router.errors import APIError, InvalidRequest, RouterFault, TooManyRequests
from tandem.router.metrics import RouterMetrics
from tandem.router.phase_metrics import ChoiceClock
from tandem.router.responses import ChoiceState, Format, usage
from tandem.router.writers import ChunkWriter, Writer

logger = logging.getLogger(__name__)

_END = object()


@dataclass
class _Outcome:
    """What the choices of one request share: whether one of them failed."""

    failed: bool = False


@dataclass
class Generation:
    """The choices of one request (`n` per prompt, numbered prompt by prompt)."""

    response_id: str
    model: str
    fmt: Format
    jobs: list[Job]
    echo_prefixes: list[str]  # per job: prompt text to echo (completions), else ""
    num_prompt_tokens: int
    include_usage: bool

    def __post_init__(self) -> None:
        self.created = int(time.time())
        self.states = [ChoiceState(i, p) for i, p in enumerate(self.echo_prefixes)]

    def body(self, choices: list[dict[str, Any]], chunk: bool) -> dict[str, Any]:
        return {
            "id": self.response_id,
            "object": self.fmt.chunk_object if chunk else self.fmt.object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    @property
    def usage(self) -> dict[str, Any]:
        completion = sum(s.completion_tokens for s in self.states)
        return usage(self.num_prompt_tokens, completion, self.num_cached_tokens)

    @property
    def num_cached_tokens(self) -> int:
        """Prompt tokens found in a prefix cache, counted once per prompt (its `n` choices
        share it; each says what its decode node found)."""
        per_prompt: dict[int, int] = {}
        for job, state in zip(self.jobs, self.states):
            key = id(job.prompt)
            per_prompt[key] = max(per_prompt.get(key, 0), state.cached_tokens)
        return sum(per_prompt.values())


class GenerationRunner:
    """Runs generations; at most `max_inflight` choices at once (a request's prompts times
    its `n`; a request that would pass the bound gets a 429, one that never fits a 400).
    A generation is built (its prompts preprocessed) on `cpu`, off the event loop."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        metrics: RouterMetrics,
        max_inflight: int,
        cpu: CpuPool,
        tracing: Tracing | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.metrics = metrics
        self.max_inflight = max_inflight
        self.cpu = cpu
        self.tracing = tracing or Tracing.off()
        self.inflight = 0  # choices

    async def respond(
        self,
        build: Callable[[], Generation],
        stream: bool,
        http: HttpRequest,
        num_choices: int = 1,
        writer: Callable[[Generation], Writer] | None = None,
    ) -> Response:
        """The whole answer, or a stream, as `writer` (default: `ChunkWriter`, OpenAI's
        completion and chat shapes) writes it for the generation. Saturation (429) is
        checked before `build` runs (on the CPU pool: what it raises is raised here), so
        overload is shed before any tokenizing; the generation's `num_choices` count as in
        flight from then until the answer or the stream is over, its preprocessing
        included."""
        self._admit(num_choices)
        self._enter(num_choices)  # no await since the check: the count is exact
        streaming = False
        try:
            gen = await self.cpu.run(build)
            out = (writer or ChunkWriter)(gen)
            if not stream:
                return await self._complete(gen, out, http)
            events = self._events(gen, buffered=False)
            first = await anext(events)  # errors before the first record become a status
            if isinstance(first[1], APIError):
                await events.aclose()
                raise first[1]
            streaming = True
            body = self._sse(gen, out, first, events)
            return _Stream(body, events, lambda: self._exit(num_choices))
        except APIError as exc:
            self._count_failure(exc, "status")
            raise
        finally:
            if not streaming:
                self._exit(num_choices)

    def _admit(self, num_choices: int) -> None:
        if num_choices > self.max_inflight:
            raise InvalidRequest(
                f"the request asks for {num_choices} choices (prompts times n), more than "
                f"the {self.max_inflight} this router runs at once",
                "n",
            )
        if self.inflight + num_choices > self.max_inflight:
            raise TooManyRequests(
                f"{self.inflight} choices are in flight; retry later", retry_after=1
            )

    def _enter(self, num_choices: int) -> None:
        self.inflight += num_choices
        self.metrics.child(self.metrics.in_flight).inc()

    def _exit(self, num_choices: int) -> None:
        self.inflight -= num_choices
        self.metrics.child(self.metrics.in_flight).dec()

    def _count_failure(self, exc: APIError, via: str) -> None:
        """Count a failure that is the servers' doing (5xx), by its error class."""
        if exc.status >= 500:
            self.metrics.child(self.metrics.failures, reason=exc.reason, via=via).inc()

    async def _complete(self, gen: Generation, writer: Writer, http: HttpRequest) -> Response:
        """Gather every choice (each retried whole on failure); abort on disconnect."""
        collect = asyncio.ensure_future(self._collect(gen))
        watch = asyncio.ensure_future(_disconnected(http))
        try:
            await asyncio.wait({collect, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not collect.done():
                collect.cancel()  # the client left: choices abort downstream
        if collect.cancelled():
            return Response(status_code=499)
        collect.result()  # raises the APIError of a failed choice
        return JSONResponse(writer.whole())

    async def _collect(self, gen: Generation) -> None:
        async for index, item in self._events(gen, buffered=True):
            if isinstance(item, APIError):
                raise item
            gen.states[index].add(item)

    async def _events(self, gen: Generation, buffered: bool) -> AsyncIterator[tuple[int, Any]]:
        """(choice index, record or APIError) from every choice, as they arrive."""
        queue: asyncio.Queue = asyncio.Queue()
        start = time.monotonic()
        first_at: float | None = None  # the earliest first token off the wire, any choice
        outcome = _Outcome()
        attributes = {
            "tandem.request_id": request_log.current(),
            "tandem.response_id": gen.response_id,
            "tandem.num_choices": len(gen.jobs),
        }
        root = self.tracing.start("tandem.router.request", None, **attributes)
        parent = tracing.carrier(root)
        tasks = [
            asyncio.create_task(self._run_choice(i, job, buffered, queue, parent, outcome))
            for i, job in enumerate(gen.jobs)
        ]
        try:
            remaining = len(tasks)
            while remaining:
                index, item = await queue.get()
                if item is _END:
                    remaining -= 1
                    continue
                if isinstance(item, dict) and item["token_ids"]:
                    # buffered (non-streamed) choices arrive whole, the first to finish
                    # first: their records' wire times say when the first token came
                    seen = item.get("received_at") or time.monotonic()
                    if first_at is None and not buffered:
                        self.metrics.child(self.metrics.ttft).observe(seen - start)
                    first_at = seen if first_at is None else min(first_at, seen)
                yield index, item
            if buffered and first_at is not None:
                self.metrics.child(self.metrics.ttft).observe(first_at - start)
            self._observe_done(gen, start)
        finally:
            for task in tasks:
                task.cancel()
            tracing.end(root)

    async def _run_choice(
        self,
        index: int,
        job: Job,
        buffered: bool,
        queue: asyncio.Queue,
        parent: tracing.Carrier,
        outcome: _Outcome,
    ) -> None:
        """Put the choice's records (or its APIError), then _END, on `queue`; observe how
        it went in the metrics, the log and its span (a child of `parent`). A choice cut
        short because a sibling failed ends as an error, not as the client's abort."""
        clock, failed = ChoiceClock(time.monotonic()), False
        attributes = {
            "tandem.request_id": request_log.current(),
            "tandem.choice_id": job.request_id,
        }
        with self.tracing.span("tandem.router.choice", parent, **attributes) as span:
            try:
                async for record in self.dispatcher.records(job, buffered):
                    clock.on_record(record)
                    await queue.put((index, record))
            except APIError as exc:
                failed = outcome.failed = True
                await queue.put((index, exc))
            finally:
                failed = failed or (outcome.failed and clock.finish_reason is None)
                self.metrics.phases.observe(clock, failed)
                reason = "error" if failed else clock.finish_reason or "abort"
                logger.info("request %s: %s", job.request_id, reason)
                _annotate(span, clock, reason)
                await queue.put((index, _END))

    def _observe_done(self, gen: Generation, start: float) -> None:
        m = self.metrics
        m.child(m.e2e).observe(time.monotonic() - start)
        m.child(m.prompt_tokens).inc(gen.num_prompt_tokens)
        m.child(m.generation_tokens).inc(gen.usage["completion_tokens"])

    async def _sse(
        self,
        gen: Generation,
        writer: Writer,
        first: tuple[int, Any],
        events: AsyncIterator[tuple[int, Any]],
    ) -> AsyncIterator[str]:
        """The stream's text: `writer`'s for each record as it arrives, then its end (or,
        for a choice that failed, or a fault of ours while writing, its failure)."""
        pending = [first]
        try:
            for text in writer.start():
                yield text
            while True:
                try:
                    index, item = pending.pop() if pending else await anext(events)
                except StopAsyncIteration:
                    break
                if isinstance(item, APIError):
                    self._count_failure(item, "event")
                    for text in writer.failed(item):
                        yield text
                    return
                gen.states[index].add(item)
                for text in writer.record(index, item):
                    yield text
            end = writer.done()
        except Exception:  # a fault of ours: the client still gets an end
            logger.exception("response %s: streaming failed", gen.response_id)
            fault = RouterFault("the router failed while streaming this answer")
            self._count_failure(fault, "event")
            end = writer.failed(fault)
        for text in end:
            yield text


class _Stream(StreamingResponse):
    """An SSE response that, however it ends (done, failed, or the client gone, even
    before the first byte), closes its events (aborting unfinished choices downstream)
    and leaves the in-flight count."""

    def __init__(
        self, body: AsyncIterator[str], events: AsyncIterator, on_close: Callable[[], None]
    ) -> None:
        super().__init__(body, media_type="text/event-stream")
        self.events = events
        self.on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with contextlib.suppress(RuntimeError):  # already closed by its own end
                await self.events.aclose()
            self.on_close()


def _annotate(span, clock: ChoiceClock, reason: str) -> None:
    """The choice's outcome and phases on its span (None: tracing is off)."""
    if span is None:
        return
    span.set_attribute("tandem.finish_reason", reason)
    if clock.usage is not None:
        span.set_attribute("tandem.completion_tokens", clock.usage["completion_tokens"])
    for phase, seconds in clock.phases().items():
        span.set_attribute(f"tandem.phase.{phase}_s", seconds)


async def _disconnected(http: HttpRequest) -> None:
    while not await http.is_disconnected():
        await asyncio.sleep(0.25)
