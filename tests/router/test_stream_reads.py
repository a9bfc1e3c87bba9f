"""A decode stream that stops sending ends instead of hanging: when the worker's health
checks eject it, and when no record comes for the read timeout; either way the client
gets the mid-stream error and the request is aborted on the worker. One request failing on
a worker does not end its other streams. The decode worker is an httpx mock transport
whose stream sends one token, then waits for the test."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from prometheus_client import CollectorRegistry

from tandem.router.dispatch import Dispatcher, Job, StreamBroken
from tandem.router.kv_index import PrefixIndex
from tandem.router.metrics import RouterMetrics
from tandem.router.policy import Route, RouteRequest, Snapshot
from tandem.router.preprocess import Prompt
from tandem.router.workers import WorkerAddress, WorkerPool
from tests.bounds import HANG_S

URL = "http://decode"


def record(token: int, finish_reason: str | None = None) -> bytes:
    usage = {"prompt_tokens": 2, "completion_tokens": 1} if finish_reason else None
    body = {"token_ids": [token], "text": "x", "logprobs": None,
            "finish_reason": finish_reason, "stop_reason": None, "usage": usage}  # fmt: skip
    return (json.dumps(body) + "\n").encode()


def only_worker(snapshot: Snapshot, req: RouteRequest) -> Route | None:
    return Route(snapshot.decode[0], None) if snapshot.decode else None


class Scene:
    """One worker in the pool, one choice streaming from it, its second record held back
    until `release`."""

    def __init__(self, read_timeout_s: float = HANG_S) -> None:
        self.release = asyncio.Event()
        self.aborted = asyncio.Event()
        self.pool = WorkerPool()
        self.pool.update([WorkerAddress(URL, "decode")])
        self.pool.health_ok(URL, {"role": "decode", "agent": "a"})
        self.http = httpx.AsyncClient(transport=httpx.MockTransport(self.handle))
        metrics = RouterMetrics(CollectorRegistry(), "m", "router-0")
        dispatcher = Dispatcher(self.pool, PrefixIndex(), only_worker, self.http, metrics, 16,
                                read_timeout_s=read_timeout_s)  # fmt: skip
        self.records = dispatcher.records(Job("r-0", Prompt([5, 6], None, ()), {}))

    async def body(self):
        yield record(1)
        await self.release.wait()
        yield record(2, "length")

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/abort":
            assert json.loads(request.content) == {"request_id": "r-0"}
            self.aborted.set()
            return httpx.Response(200, json={"aborted": True})
        return httpx.Response(200, content=self.body())

    async def reading(self) -> asyncio.Future:
        """The second record's read, once it waits on the worker."""
        assert (await anext(self.records))["token_ids"] == [1]
        pending = asyncio.ensure_future(anext(self.records))
        worker = self.pool.workers[URL]
        while not worker.open_reads:
            await asyncio.sleep(0)
        return pending


def run(scenario) -> None:
    async def go() -> None:
        async with asyncio.timeout(HANG_S):  # a hang fails the test, nothing else does
            await scenario()

    asyncio.run(go())


def test_an_ejection_by_health_checks_ends_the_workers_open_streams():
    async def scenario() -> None:
        scene = Scene()
        pending = await scene.reading()
        scene.pool.health_failed(URL)
        assert scene.pool.workers[URL].healthy  # one failure: not ejected
        scene.pool.health_failed(URL)  # the second in a row: ejected
        with pytest.raises(StreamBroken) as err:
            await pending
        assert "decode worker failed mid-stream" in str(err.value)
        assert "ejected" in str(err.value)
        await scene.aborted.wait()
        await scene.http.aclose()

    run(scenario)


def test_a_stream_silent_for_the_read_timeout_ends_and_is_aborted():
    async def scenario() -> None:
        scene = Scene(read_timeout_s=0.01)
        assert (await anext(scene.records))["token_ids"] == [1]
        with pytest.raises(StreamBroken) as err:
            await anext(scene.records)
        assert "decode worker failed mid-stream" in str(err.value)
        assert "no record for 0.01 s" in str(err.value)
        await scene.aborted.wait()
        await scene.http.aclose()

    run(scenario)


def test_one_failed_request_ejects_the_worker_but_its_other_streams_go_on():
    async def scenario() -> None:
        scene = Scene()
        pending = await scene.reading()
        scene.pool.health_failed(URL, eject=True)  # what a failed request does
        assert not scene.pool.workers[URL].healthy
        scene.release.set()
        assert (await pending)["finish_reason"] == "length"
        assert not scene.aborted.is_set()
        await scene.http.aclose()

    run(scenario)
