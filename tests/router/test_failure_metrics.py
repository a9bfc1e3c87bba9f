"""Every failure the servers cause is visible in a router metric: a 5xx answer, and an SSE
error event after the stream began (its status is 200, so `tandem_router_requests_total`
cannot show it). No processes: a scripted dispatcher stands in for the decode workers."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tandem.router.cpu_pool import CpuPool
from tandem.router.dispatch import Job, StreamBroken
from tandem.router.errors import Unavailable, UpstreamFailed
from tandem.router.generation import Generation, GenerationRunner
from tandem.router.metrics import RouterMetrics
from tandem.router.responses import CompletionFormat
from tests.disagg.nodes import metric_value

FAILURES = "tandem_router_request_failures_total"


def record(token: int, finish: str | None = None) -> dict:
    rec = {"token_ids": [token], "text": "x", "logprobs": None, "finish_reason": finish}
    if finish:
        rec |= {"stop_reason": None, "usage": {"completion_tokens": 1}}
    return rec


class ScriptedDispatcher:
    """Each job's records from a script; an exception in the script is raised there."""

    def __init__(self, scripts: list[list]) -> None:
        self.scripts = scripts

    async def records(self, job: Job, buffered: bool = False):
        for item in self.scripts[int(job.request_id.rsplit("-", 1)[1])]:
            if isinstance(item, Exception):
                raise item
            if item is HANG:
                await asyncio.Event().wait()  # until cancelled
            yield item


HANG = object()  # a script item: the choice waits until it is cancelled


class Connected:
    async def is_disconnected(self) -> bool:
        return False


def run(scripts: list[list], stream: bool) -> tuple[RouterMetrics, object]:
    """One generation of len(scripts) choices; (metrics, the response or the APIError)."""
    metrics = RouterMetrics(CollectorRegistry(), "m", "router-0")
    runner = GenerationRunner(ScriptedDispatcher(scripts), metrics, 4, CpuPool(1))
    jobs = [Job(f"r-{i}", None, {}) for i in range(len(scripts))]

    def build() -> Generation:
        return Generation("r", "m", CompletionFormat(None, False), jobs, [""] * len(jobs), 1, False)

    async def go():
        try:
            response = await runner.respond(build, stream, Connected())
        except (Unavailable, UpstreamFailed) as exc:
            return exc
        if stream:
            return [chunk async for chunk in response.body_iterator]
        return response

    return metrics, asyncio.run(go())


def failures(metrics: RouterMetrics, **labels: str) -> float:
    return metric_value(generate_latest(metrics.registry).decode(), FAILURES, **labels)


def test_an_error_event_mid_stream_is_counted():
    broken = StreamBroken("decode worker failed mid-stream")
    metrics, chunks = run([[record(1), broken]], stream=True)
    events = [json.loads(c[6:]) for c in chunks if c != "data: [DONE]\n\n"]
    assert "error" in events[-1] and chunks[-1] == "data: [DONE]\n\n"
    assert failures(metrics, reason="stream_broken", via="event") == 1


def test_a_second_choice_failing_after_the_first_streamed_is_counted():
    gone = UpstreamFailed("request failed on 3 worker(s)")
    metrics, chunks = run([[record(1), record(2, "length")], [gone]], stream=True)
    assert any('"error"' in c for c in chunks)
    assert failures(metrics, reason="upstream_failed", via="event") == 1


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("error", "reason"),
    [(Unavailable("no decode worker"), "unavailable"), (UpstreamFailed("x"), "upstream_failed")],
)
def test_an_error_status_is_counted(stream, error, reason):
    metrics, answer = run([[error]], stream=stream)
    assert answer is error
    assert failures(metrics, reason=reason, via="status") == 1
    assert failures(metrics) == 1


def test_success_counts_no_failure():
    metrics, answer = run([[record(1), record(2, "length")]], stream=False)
    assert answer.status_code == 200 and failures(metrics) == 0


def finished(metrics: RouterMetrics, reason: str) -> float:
    text = generate_latest(metrics.registry).decode()
    return metric_value(text, "tandem_request_success_total", finish_reason=reason)


@pytest.mark.parametrize("stream", [False, True])
def test_a_choice_cut_short_by_a_failing_sibling_ends_as_an_error_not_an_abort(stream):
    gone = UpstreamFailed("request failed on 3 worker(s)")
    metrics, _ = run([[record(1), HANG], [gone]], stream=stream)
    assert finished(metrics, "error") == 2
    assert finished(metrics, "abort") == 0


def test_a_non_streamed_request_times_the_earliest_first_token_of_its_choices():
    """Held choices reach the router whole, in the order they finished: the first one seen
    need not hold the first token. Wire times (received_at) say which came first."""
    base = time.monotonic()

    def choice(at: float) -> list[dict]:  # the dispatcher stamps every record
        return [record(1) | {"received_at": at}, record(2, "length") | {"received_at": at + 1}]

    late, early = choice(base + 100), choice(base + 50)
    metrics, _ = run([late, early], stream=False)
    text = generate_latest(metrics.registry).decode()
    assert metric_value(text, "tandem_time_to_first_token_seconds_count") == 1
    assert 25 < metric_value(text, "tandem_time_to_first_token_seconds_sum") < 75  # not 100
