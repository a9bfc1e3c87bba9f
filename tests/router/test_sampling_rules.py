"""Sampling parameters have one set of rules, `SamplingParams`' own: for every bound in
`API_RANGES` (the engine's `RANGES`, narrowed where the API is narrower) and every rule
between fields, a value just outside it gets the router's API error, a 400 naming the
field, with the very message `SamplingParams` raises. The request
models hold the API's shape only: no numeric bound of their own. No processes: the router's
app in-process, with no workers."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from tandem.engine.core.sampling_params import (
    API_LOGIT_BIAS,
    API_RANGES,
    InvalidSamplingParam,
    Range,
    SamplingParams,
)
from tandem.router.app import Router, RouterOptions
from tandem.router.discovery import StaticDiscovery
from tandem.router.metrics import RouterMetrics
from tandem.router.policy import POLICIES
from tandem.router.preprocess import ModelLimits, Preprocessor
from tandem.router.protocol import ChatCompletionRequest, CompletionRequest

MESSAGES = [{"role": "user", "content": "hi"}]


def outside(name: str, allowed: Range) -> list[Any]:
    """The values just past each end of `allowed`, by the field's own type."""
    is_int = "int" in str(SamplingParams.__dataclass_fields__[name].type)
    step = 1 if is_int else 0.5
    values = [allowed.low if allowed.low_open else allowed.low - step]
    if allowed.high is not None:
        values.append(allowed.high + step)
    if is_int:
        return values
    return [float(v) for v in values] + [math.nan]  # as the API's float fields take them


def cases() -> list[tuple[str, dict[str, Any], dict[str, Any], str]]:
    """(path, request body, SamplingParams kwargs, the API's param) for every rule."""
    found = []
    for name, allowed in API_RANGES.items():
        for value in outside(name, allowed):
            if name == "max_tokens" and value > 1:
                continue  # the model's context bounds it first, in the router's own words
            found.append(("/v1/completions", {"prompt": "x", name: value}, {name: value}, name))
    found += [
        ("/v1/completions", {"prompt": "x", "min_tokens": 9, "max_tokens": 2},
         {"min_tokens": 9, "max_tokens": 2}, "min_tokens"),
        ("/v1/completions", {"prompt": "x", "stop": ["a", ""]}, {"stop": ["a", ""]}, "stop"),
        ("/v1/completions", {"prompt": "x", "logit_bias": {"abc": 1}},
         {"logit_bias": {"abc": 1}}, "logit_bias"),
        ("/v1/chat/completions", {"messages": MESSAGES, "logprobs": True, "top_logprobs": 21},
         {"logprobs": 21}, "top_logprobs"),
        ("/v1/chat/completions", {"messages": MESSAGES, "max_completion_tokens": 0},
         {"max_tokens": 0}, "max_completion_tokens"),
        ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 0},
         {"max_tokens": 0}, "max_tokens"),
    ]  # fmt: skip
    for value in (API_LOGIT_BIAS.low - 1, API_LOGIT_BIAS.high + 1):
        body = {"prompt": "x", "logit_bias": {"5": value}}
        found.append(("/v1/completions", body, {"logit_bias": {5: value}}, "logit_bias"))
    return found


def engine_error(kwargs: dict[str, Any]) -> InvalidSamplingParam:
    with pytest.raises(InvalidSamplingParam) as caught:
        SamplingParams(**kwargs).check_api_limits()
    return caught.value


def post_all(router: Router, requests: list[tuple[str, dict[str, Any]]]) -> list[httpx.Response]:
    async def go() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=router.app)
        async with (
            router.app.router.lifespan_context(router.app),
            httpx.AsyncClient(transport=transport, base_url="http://router") as client,
        ):
            # json.dumps by hand: httpx refuses NaN, which Python's json (and the router) take
            return [
                await client.post(path, content=json.dumps(body), headers=JSON)
                for path, body in requests
            ]

    return asyncio.run(go())


JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def router(tokenizer) -> Router:
    pre = Preprocessor(tokenizer, ModelLimits("m", len(tokenizer), 512, 16))
    metrics = RouterMetrics(CollectorRegistry(), "m", "router-0")
    discovery = StaticDiscovery([], [])  # no workers: nothing valid gets further than a 503
    return Router(pre, POLICIES["round-robin"], discovery, metrics, RouterOptions())


def test_every_bound_is_the_engines_and_the_api_error_is_its_own(router):
    found = cases()
    responses = post_all(router, [(path, body) for path, body, _, _ in found])
    for (path, body, kwargs, param), response in zip(found, responses, strict=True):
        expected = engine_error(kwargs)
        assert response.status_code == 400, (path, body, response.text)
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error", (body, error)
        assert error["param"] == param, (body, error)
        assert error["message"] == str(expected), (body, error)


def test_the_edges_themselves_are_allowed():
    for name, allowed in API_RANGES.items():
        edges = [allowed.high] if allowed.low_open else [allowed.low, allowed.high]
        for value in edges:
            if value is not None:
                SamplingParams(**{name: value, "max_tokens": None}).check_api_limits()
    biases = {1: API_LOGIT_BIAS.low, 2: API_LOGIT_BIAS.high}
    SamplingParams(logit_bias=biases).check_api_limits()


@pytest.mark.parametrize(
    "field, value", [("temperature", 5.0), ("n", 32), ("logprobs", 50), ("logit_bias", {1: 500.0})]
)
def test_the_offline_engine_keeps_its_wider_ranges(field, value):
    """What the API narrows, the engine still takes (as vLLM's offline engine does)."""
    params = SamplingParams(**{field: value})
    with pytest.raises(InvalidSamplingParam) as caught:
        params.check_api_limits()
    assert caught.value.param == field


def test_the_request_models_carry_no_bounds_of_their_own():
    bounds = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            assert not bounds & node.keys(), f"{where} has a bound of its own: {node}"
            for key, child in node.items():
                walk(child, f"{where}.{key}")
        elif isinstance(node, list):
            for i, child in enumerate(node):
                walk(child, f"{where}.{i}")

    for model in (CompletionRequest, ChatCompletionRequest):
        walk(model.model_json_schema(), model.__name__)
