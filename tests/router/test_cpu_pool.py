"""A request's CPU work (templates, tokenizing, hashing, grammars) runs on the router's CPU
pool, so its event loop serves everyone else meanwhile: while one request is provably held
inside preprocessing (a threading.Event), another streams to its end and `/health` answers.
A held request that ran on the loop instead would hold the loop, and both checks fail.
No worker processes: a scripted dispatcher, or none, or a mock transport stands in."""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import pytest
from prometheus_client import CollectorRegistry

from tandem.engine.api.wire import PROTOCOL_VERSION
from tandem.engine.telemetry import request_log
from tandem.router.app import Router, RouterOptions
from tandem.router.cpu_pool import CpuPool
from tandem.router.discovery import StaticDiscovery
from tandem.router.dispatch import Dispatcher, Job
from tandem.router.errors import InvalidRequest
from tandem.router.generation import Generation, GenerationRunner
from tandem.router.kv_index import PrefixIndex
from tandem.router.metrics import RouterMetrics
from tandem.router.policy import POLICIES
from tandem.router.preprocess import ModelLimits, Preprocessor
from tandem.router.protocol import CompletionRequest
from tandem.router.responses import CompletionFormat
from tandem.router.workers import WorkerAddress, WorkerPool
from tests.bounds import HANG_S
from tests.router.test_failure_metrics import Connected, ScriptedDispatcher, record


class Gate:
    """Where a test holds a call: `inside` is set while a call is held, until `release`."""

    def __init__(self) -> None:
        self.inside = threading.Event()
        self.release = threading.Event()

    def hold(self) -> None:
        self.inside.set()
        try:
            self.release.wait(HANG_S)
        finally:
            self.inside.clear()


def generation(name: str) -> Generation:
    fmt = CompletionFormat(None, False)
    return Generation(name, "m", fmt, [Job(f"{name}-0", None, {})], [""], 1, False)


def runner(num_workers: int) -> GenerationRunner:
    script = [record(1), record(2), record(3, "length")]
    metrics = RouterMetrics(CollectorRegistry(), "m", "router-0")
    return GenerationRunner(ScriptedDispatcher([script]), metrics, 4, CpuPool(num_workers))


def test_another_request_streams_to_its_end_while_one_is_held_in_preprocessing():
    gen_runner, gate = runner(2), Gate()

    def held_build() -> Generation:
        gate.hold()
        return generation("held")

    async def chunks(build) -> list[str]:
        response = await gen_runner.respond(build, True, Connected())
        return [chunk async for chunk in response.body_iterator]

    async def go() -> tuple[list[str], bool, list[str]]:
        held = asyncio.create_task(chunks(held_build))
        assert await asyncio.to_thread(gate.inside.wait, HANG_S)
        other = await chunks(lambda: generation("other"))
        still_held = gate.inside.is_set()
        gate.release.set()
        return other, still_held, await held

    other, still_held, held = asyncio.run(go())
    assert still_held, "the other request only ran once preprocessing let go of the loop"
    assert other[-1] == "data: [DONE]\n\n" and len(other) == 4  # three records, then DONE
    assert held[-1] == "data: [DONE]\n\n" and len(held) == 4


def test_an_error_raised_in_preprocessing_is_raised_as_is_and_frees_its_choices():
    gen_runner = runner(1)

    def bad_build() -> Generation:
        raise InvalidRequest("messages must not be empty", "messages")

    with pytest.raises(InvalidRequest) as caught:
        asyncio.run(gen_runner.respond(bad_build, False, Connected(), num_choices=3))
    assert caught.value.status == 400 and caught.value.param == "messages"
    assert gen_runner.inflight == 0


def test_a_call_on_the_pool_sees_the_callers_request_id():
    async def go() -> str | None:
        with request_log.request_context("req-42"):
            return await CpuPool(1).run(request_log.current)

    assert asyncio.run(go()) == "req-42"


def test_a_pool_needs_a_worker():
    with pytest.raises(ValueError, match="at least one worker"):
        CpuPool(0)
    with pytest.raises(ValueError, match="--cpu-workers"):
        RouterOptions(cpu_workers=0)


class HeldPreprocessor(Preprocessor):
    """The real preprocessor, but `tokenize` waits at a gate first."""

    def __init__(self, tokenizer, limits: ModelLimits, gate: Gate) -> None:
        super().__init__(tokenizer, limits)
        self.gate = gate

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.gate.hold()
        return super().tokenize(text, add_special_tokens)


def test_health_answers_while_a_long_prompt_is_held_in_the_tokenizer(tokenizer):
    gate = Gate()
    pre = HeldPreprocessor(tokenizer, ModelLimits("m", 1000, 512, 16), gate)
    discovery = StaticDiscovery([], [])  # no workers
    metrics = RouterMetrics(CollectorRegistry(), "m", "router-0")
    router = Router(pre, POLICIES["round-robin"], discovery, metrics, RouterOptions())

    async def go() -> tuple[int, bool, httpx.Response]:
        transport = httpx.ASGITransport(app=router.app)
        async with (
            router.app.router.lifespan_context(router.app),
            httpx.AsyncClient(transport=transport, base_url="http://router") as client,
        ):
            body = {"prompt": "a long prompt " * 7000}
            tokenize = asyncio.create_task(client.post("/tokenize", json=body))
            assert await asyncio.to_thread(gate.inside.wait, HANG_S)
            health = await client.get("/health")
            still_held = gate.inside.is_set()
            gate.release.set()
            return health.status_code, still_held, await tokenize

    health_status, still_held, tokenized = asyncio.run(go())
    assert still_held, "/health was only answered once tokenizing let go of the loop"
    assert health_status == 503  # answered: no decode worker is healthy
    assert tokenized.status_code == 200 and tokenized.json()["count"] > 7000


def test_a_prompts_ids_are_encoded_in_preprocessing_and_sent_as_encoded(tokenizer):
    pre = Preprocessor(tokenizer, ModelLimits("m", 1000, 512, 16))
    [prompt] = pre.completion_prompts(CompletionRequest(prompt="a prompt " * 20))
    assert prompt.token_ids_json == json.dumps(prompt.token_ids, separators=(",", ":"))
    bodies: list[bytes] = []

    def node(request: httpx.Request) -> httpx.Response:
        bodies.append(request.content)
        last = record(7, "length")
        return httpx.Response(200, content=json.dumps(last) + "\n")

    pool = WorkerPool()
    pool.update([WorkerAddress("http://decode", "decode")])
    pool.health_ok("http://decode", {"role": "decode", "agent": "d"})
    metrics = RouterMetrics(CollectorRegistry(), "m", "router-0")
    sampling = {"max_tokens": 1, "stop": ["é"]}

    async def go() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(node)) as http:
            policy = POLICIES["round-robin"]
            dispatcher = Dispatcher(pool, PrefixIndex(), policy, http, metrics, 16)
            job = Job("r-0", prompt, sampling, "salt")
            assert [r["finish_reason"] async for r in dispatcher.records(job)] == ["length"]

    asyncio.run(go())
    assert prompt.token_ids_json.encode() in bodies[0]  # spliced in, not encoded again
    assert json.loads(bodies[0]) == {
        "request_id": "r-0", "token_ids": prompt.token_ids, "sampling": sampling,
        "prefill": None, "prefill_alternates": [], "cache_salt": "salt",
        "protocol": PROTOCOL_VERSION,
    }  # fmt: skip
