"""Sends one choice of one request to a decode worker and reads its records back, with the
router's failure policy: a decode worker that fails before any token reached the client is
ejected and the choice is retried on another one (up to `max_attempts` workers); after a
token has been streamed the stream ends with an error. A worker that sends no record for
`read_timeout_s`, or that its health checks eject, fails the attempt the same way. A
caller that stops reading (the client went away) aborts the request on the decode worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from tandem.engine.api.wire import PROTOCOL_VERSION
from tandem.engine.telemetry import request_log, tracing
from tandem.router.errors import APIError, InvalidRequest, Unavailable, UpstreamFailed
from tandem.router.http_pool import ClientShards
from tandem.router.kv_index import PrefixIndex, PrefixMatch
from tandem.router.metrics import RouterMetrics
from tandem.router.policy import (
    DEFAULT_TIER_COSTS,
    Policy,
    Route,
    RouteRequest,
    Snapshot,
    TierCosts,
)
from tandem.router.preprocess import Prompt
from tandem.router.stream_reads import ReadCut, bounded_lines
from tandem.router.workers import WorkerPool, WorkerState

logger = logging.getLogger(__name__)

# Seconds a decode worker's stream may go without a record before the attempt fails. A
# record comes per step once the request runs (milliseconds on a GPU, under a second on a
# CPU); the first waits for the prefill and for a place in the node's queue, so the bound
# is generous: a node that queues for longer than this is treated as failing.
READ_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Job:
    """One choice of one prompt, as sent to a decode worker."""

    request_id: str
    prompt: Prompt
    sampling: dict[str, Any]
    cache_salt: str | None = None


class WorkerFailed(Exception):
    """The decode worker failed the request (retriable while nothing was streamed).
    `worker_at_fault` is False when the worker says the failure was not its own (its remote
    prefill failed under `--on-prefill-failure fail`): it stays in the pool."""

    def __init__(self, message: str, worker_at_fault: bool = True) -> None:
        super().__init__(message)
        self.worker_at_fault = worker_at_fault


class StreamBroken(APIError):
    """The decode worker failed after tokens reached the client."""

    status = 502
    kind = "server_error"


class Dispatcher:
    def __init__(
        self,
        pool: WorkerPool,
        index: PrefixIndex,
        policy: Policy,
        http: httpx.AsyncClient | ClientShards,
        metrics: RouterMetrics,
        block_size: int,
        max_attempts: int = 3,
        read_timeout_s: float = READ_TIMEOUT_S,
        tier_costs: TierCosts = DEFAULT_TIER_COSTS,
    ) -> None:
        self.pool = pool
        self.index = index
        self.policy = policy
        self.http = http
        self.metrics = metrics
        self.block_size = block_size
        self.max_attempts = max_attempts
        self.read_timeout_s = read_timeout_s
        self.tier_costs = tier_costs
        self._seq = 0
        self._aborts: set[asyncio.Task] = set()

    def route(self, prompt: Prompt, exclude: frozenset[str] = frozenset()) -> Route:
        """Pick (prefill, decode) for a prompt; Unavailable when no decode worker is up."""
        start = time.perf_counter()
        prefill, decode = self.pool.snapshot(self._matches(prompt), exclude)
        self._seq += 1
        num_blocks, num_tokens = len(prompt.block_hashes), len(prompt.token_ids)
        req = RouteRequest(self._seq, num_blocks, num_tokens, self.block_size, self.tier_costs)
        route = self.policy(Snapshot(prefill, decode), req)
        if route is None:
            raise Unavailable("no decode worker is available", retry_after=1)
        self.metrics.observe_route(route, time.perf_counter() - start)
        return route

    def _matches(self, prompt: Prompt) -> dict[str, PrefixMatch]:
        """Cached leading blocks per worker and tier, each matched with its revision's
        hashes."""
        return {
            url: self.index.match(url, prompt.hashes_for(worker.revision, self.block_size))
            for url, worker in self.pool.workers.items()
        }

    async def records(self, job: Job, buffered: bool = False) -> AsyncIterator[dict[str, Any]]:
        """The decode worker's records for `job`. With `buffered`, records are held until
        the choice finished (so any failure may be retried); otherwise they flow as they
        come and a failure after the first token raises StreamBroken."""
        tried: set[str] = set()
        while True:
            route = self.route(job.prompt, frozenset(tried))
            tried.add(route.decode.url)
            held: list[dict[str, Any]] = []
            streamed = False
            try:
                async for record in self._attempt(job, route):
                    if buffered:
                        held.append(record)
                        continue
                    streamed = streamed or bool(record["token_ids"] or record["text"])
                    yield record
                for record in held:
                    yield record
                return
            except WorkerFailed as exc:
                error = self.on_failure(route.decode.url, exc, streamed, len(tried))
                if error is not None:
                    raise error from exc
                logger.warning(
                    "request %s: %s; retrying on another decode worker", job.request_id, exc
                )

    def on_failure(
        self, url: str, exc: WorkerFailed, streamed: bool, num_tried: int
    ) -> APIError | None:
        """The policy for a decode worker at `url` that failed a choice after `num_tried`
        workers were tried: eject it when at fault; then the error that ends the choice
        (`StreamBroken` once tokens reached the client, `UpstreamFailed` after
        `max_attempts` workers), or None: retry on another worker, counted by reason in
        `tandem_router_retries_total`. No I/O: the simulator drives it too."""
        if exc.worker_at_fault:
            self.pool.health_failed(url, eject=True)
        if streamed:
            return StreamBroken(f"decode worker failed mid-stream: {exc}")
        if num_tried >= self.max_attempts:
            return UpstreamFailed(f"request failed on {num_tried} worker(s): {exc}")
        reason = "decode_failed" if exc.worker_at_fault else "prefill_failed"
        self.metrics.child(self.metrics.retries, reason=reason).inc()
        return None

    async def _attempt(self, job: Job, route: Route) -> AsyncIterator[dict[str, Any]]:
        decode, prefill = route.decode, route.prefill
        body = _generate_body(job, route)
        # the router's own load counts: prefill until the first record, decode until the end
        decode_state = self.pool.workers.get(decode.url)
        prefill_state = self.pool.workers.get(prefill.url) if prefill else None
        _count(+1, decode_state, prefill_state)
        finished = False
        logger.info(
            "request %s: decode %s, prefill %s", job.request_id, decode.url,
            prefill.url if prefill else None,
        )  # fmt: skip
        request_id = request_log.current()
        headers = tracing.current_carrier()  # the choice's span: the decode node's parent
        headers["content-type"] = "application/json"
        if request_id:
            headers[request_log.HEADER] = request_id
        try:
            async with self.http.stream(
                "POST", f"{decode.url}/generate", content=body, headers=headers
            ) as r:
                await self._check_status(r)
                lines = bounded_lines(r.aiter_lines(), decode_state, self.read_timeout_s)
                async for line in lines:
                    if not line:
                        continue
                    record = json.loads(line)
                    record["received_at"] = time.monotonic()  # phase metrics: off the wire
                    _count(-1, prefill_state)  # the prefill part is over
                    prefill_state = None
                    finished = record["finish_reason"] is not None
                    if record.get("error"):
                        at_fault = record.get("error_source") != "prefill"
                        raise WorkerFailed(record["error"], worker_at_fault=at_fault)
                    yield record
            if not finished:
                raise WorkerFailed(f"{decode.url} closed the stream before the end")
        except ReadCut as exc:
            raise WorkerFailed(f"{decode.url}: {exc}") from exc
        except (httpx.HTTPError, json.JSONDecodeError) as exc:
            raise WorkerFailed(f"{decode.url}: {exc!r}") from exc
        finally:
            _count(-1, decode_state, prefill_state)
            if not finished:
                self._abort(decode.url, job.request_id)

    async def _check_status(self, r: httpx.Response) -> None:
        if r.status_code == 200:
            return
        await r.aread()
        try:
            message = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = r.text[:200]
        if r.status_code == 400:
            raise InvalidRequest(message)
        raise WorkerFailed(f"status {r.status_code}: {message}")

    def _abort(self, url: str, request_id: str) -> None:
        """Tell the decode worker to drop the request (fire and forget: it also notices
        the closed stream)."""

        async def send() -> None:
            with contextlib.suppress(httpx.HTTPError):  # a dead worker has nothing to free
                await self.http.post(f"{url}/abort", json={"request_id": request_id}, timeout=5)

        task = asyncio.get_running_loop().create_task(send())
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)


def _generate_body(job: Job, route: Route) -> bytes:
    """The decode node's `POST /generate` body, the prompt's ids spliced in as encoded
    off the event loop (`Prompt.token_ids_json`), so only the small fields are encoded here."""
    rest = {
        "request_id": job.request_id,
        "sampling": job.sampling,
        "prefill": route.prefill.endpoint if route.prefill else None,
        "prefill_alternates": [p.endpoint for p in route.alternates if p.endpoint],
        "cache_salt": job.cache_salt,
        "protocol": PROTOCOL_VERSION,
    }
    ids = job.prompt.token_ids_json
    if ids is None:
        ids = json.dumps(job.prompt.token_ids, separators=(",", ":"))
    # as httpx's `json=` encodes a body: no NaN, UTF-8
    fields = json.dumps(rest, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return f'{{"token_ids":{ids},{fields[1:]}'.encode()


def _count(delta: int, *workers: WorkerState | None) -> None:
    for worker in workers:
        if worker is not None:
            worker.inflight += delta
