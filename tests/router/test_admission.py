"""Admission against `max_inflight` counts choices (a completion's prompts times `n`), and a
completion's prompt list is bounded. No processes: a scripted dispatcher stands in."""

from __future__ import annotations

import asyncio
import json

import pytest
from prometheus_client import CollectorRegistry

from tandem.router.cpu_pool import CpuPool
from tandem.router.dispatch import Job
from tandem.router.errors import InvalidRequest, TooManyRequests
from tandem.router.generation import Generation, GenerationRunner
from tandem.router.metrics import RouterMetrics
from tandem.router.preprocess import MAX_PROMPTS, prompt_items
from tandem.router.protocol import CompletionRequest
from tandem.router.responses import CompletionFormat
from tests.router.test_failure_metrics import HANG, Connected, ScriptedDispatcher, record


def generation(num_choices: int) -> Generation:
    jobs = [Job(f"r-{i}", None, {}) for i in range(num_choices)]
    fmt = CompletionFormat(None, False)
    return Generation("r", "m", fmt, jobs, [""] * num_choices, 1, False)


def test_choices_in_flight_count_against_max_inflight():
    runner = GenerationRunner(
        ScriptedDispatcher([[record(1), HANG]] * 4),
        RouterMetrics(CollectorRegistry(), "m", "router-0"),
        max_inflight=4,
        cpu=CpuPool(1),
    )

    async def go() -> None:
        held = await runner.respond(lambda: generation(3), True, Connected(), num_choices=3)
        assert runner.inflight == 3
        with pytest.raises(TooManyRequests):  # 3 + 2 > 4
            await runner.respond(lambda: generation(2), True, Connected(), num_choices=2)
        one = await runner.respond(lambda: generation(1), True, Connected(), num_choices=1)
        assert runner.inflight == 4
        for stream in (held, one):
            await stream.events.aclose()

    asyncio.run(go())


def test_a_request_with_more_choices_than_max_inflight_is_a_400_not_a_429():
    runner = GenerationRunner(
        ScriptedDispatcher([]), RouterMetrics(CollectorRegistry(), "m", "router-0"), 4, CpuPool(1)
    )
    with pytest.raises(InvalidRequest) as caught:
        asyncio.run(runner.respond(lambda: generation(5), False, Connected(), num_choices=5))
    assert caught.value.status == 400 and runner.inflight == 0


def test_a_prompt_list_is_bounded_with_the_apis_error_body():
    assert len(prompt_items(CompletionRequest(prompt=["x"] * MAX_PROMPTS))) == MAX_PROMPTS
    assert len(prompt_items(CompletionRequest(prompt=[[1, 2]] * MAX_PROMPTS))) == MAX_PROMPTS
    assert len(prompt_items(CompletionRequest(prompt=list(range(1000))))) == 1  # one prompt
    with pytest.raises(InvalidRequest) as caught:
        prompt_items(CompletionRequest(prompt=["x"] * (MAX_PROMPTS + 1)))
    response = caught.value.response()
    body = json.loads(response.body)
    assert response.status_code == 400
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["param"] == "prompt"
