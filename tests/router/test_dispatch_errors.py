"""What the router does with a decode worker's error record: a failure of the worker itself
ejects it from the pool before the choice is retried elsewhere; a failed remote prefill
(`error_source: prefill`, the worker is sound) is retried elsewhere without ejecting it.
The decode workers are an httpx mock transport: the router's dispatch is the unit."""

from __future__ import annotations

import asyncio
import json

import httpx
from prometheus_client import CollectorRegistry, generate_latest

from tandem.router.dispatch import Dispatcher, Job
from tandem.router.kv_index import PrefixIndex
from tandem.router.metrics import RouterMetrics
from tandem.router.policy import Route, RouteRequest, Snapshot
from tandem.router.preprocess import Prompt
from tandem.router.workers import WorkerAddress, WorkerPool
from tests.disagg.nodes import metric_value

FAILING, SOUND = "http://failing", "http://sound"


def _decode_workers(error_source: str | None) -> httpx.MockTransport:
    """FAILING answers every request with an error record (of `error_source`), SOUND with
    one token."""

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/abort":
            return httpx.Response(200, json={})
        usage = {"prompt_tokens": 2, "completion_tokens": 1}
        record = {"token_ids": [7], "text": "x", "logprobs": None, "finish_reason": "length",
                  "stop_reason": None, "usage": usage}  # fmt: skip
        if str(request.url).startswith(FAILING):
            record |= {"token_ids": [], "text": "", "finish_reason": "error", "error": "boom"}
            if error_source is not None:
                record["error_source"] = error_source
        return httpx.Response(200, content=json.dumps(record) + "\n")

    return httpx.MockTransport(handle)


def first_by_url(snapshot: Snapshot, req: RouteRequest) -> Route | None:
    """FAILING first (the snapshot is sorted by URL), SOUND once FAILING is excluded."""
    return Route(snapshot.decode[0], None) if snapshot.decode else None


def _dispatch(error_source: str | None) -> tuple[WorkerPool, list[dict], str]:
    pool = WorkerPool()
    pool.update([WorkerAddress(FAILING, "decode"), WorkerAddress(SOUND, "decode")])
    for url in (FAILING, SOUND):
        pool.health_ok(url, {"role": "decode", "agent": url})
    metrics = RouterMetrics(CollectorRegistry(), "m", "router-0")

    async def go() -> list[dict]:
        http = httpx.AsyncClient(transport=_decode_workers(error_source))
        dispatcher = Dispatcher(pool, PrefixIndex(), first_by_url, http, metrics, 16)
        job = Job("r-0", Prompt([5, 6], None, ()), {})
        records = [r async for r in dispatcher.records(job)]
        await asyncio.sleep(0)  # the fire-and-forget abort of the failed attempt
        await http.aclose()
        return records

    records = asyncio.run(go())
    return pool, records, generate_latest(metrics.registry).decode()


def test_a_failed_remote_prefill_is_retried_elsewhere_without_ejecting_the_worker():
    pool, records, text = _dispatch("prefill")
    assert records[-1]["finish_reason"] == "length"  # served by the other worker
    assert pool.workers[FAILING].healthy and pool.workers[FAILING].failures == 0
    assert metric_value(text, "tandem_router_retries_total", reason="prefill_failed") == 1
    assert metric_value(text, "tandem_router_retries_total", reason="decode_failed") == 0


def test_a_decode_workers_own_failure_ejects_it_before_the_retry():
    for source in ("decode", None):  # an older node sends no source: its own fault
        pool, records, text = _dispatch(source)
        assert records[-1]["finish_reason"] == "length"
        assert not pool.workers[FAILING].healthy
        assert metric_value(text, "tandem_router_retries_total", reason="decode_failed") == 1
