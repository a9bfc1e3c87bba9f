"""ClientShards against a real local HTTP server: at most `shard_size` requests in flight on
a shard, shards made on demand and reused in order, connections kept between requests,
places given back when a request fails."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from tandem.engine.api.ports import free_port
from tandem.router.http_pool import ClientShards


class Server:
    """A uvicorn server in a thread; `/wait` streams a line once `gate` is set; every
    request's client port is recorded (one port: one connection)."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.ports: list[int] = []
        self.waiting = 0
        app = FastAPI()

        @app.post("/wait")
        async def wait(request: Request) -> StreamingResponse:
            self.ports.append(request.client.port)

            async def body():
                self.waiting += 1
                while not self.gate.is_set():
                    await asyncio.sleep(0.005)
                self.waiting -= 1
                yield b"done\n"

            return StreamingResponse(body())

        self.port = free_port()
        config = uvicorn.Config(app, port=self.port, log_level="error", timeout_keep_alive=120)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    async def until_waiting(self, n: int) -> None:
        while self.waiting < n:
            await asyncio.sleep(0.005)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/wait"


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    s.thread.start()
    while not s.server.started:
        time.sleep(0.01)
    yield s
    s.gate.set()
    s.server.should_exit = True
    s.thread.join(30)


def shards(size: int) -> ClientShards:
    return ClientShards(lambda limits: httpx.AsyncClient(limits=limits), 60.0, size)


async def one(http: ClientShards, url: str) -> str:
    async with http.stream("POST", url) as r:
        return (await r.aread()).decode()


def test_shards_hold_at_most_their_size_and_are_reused_in_order(server: Server) -> None:
    async def run() -> None:
        async with shards(4) as http:
            tasks = [asyncio.create_task(one(http, server.url)) for _ in range(10)]
            await asyncio.wait_for(server.until_waiting(10), 60)  # all in flight there
            assert http.in_flight == [4, 4, 2]
            server.gate.set()
            assert await asyncio.gather(*tasks) == ["done\n"] * 10
            assert http.in_flight == [0, 0, 0]
            assert len(set(server.ports)) == 10  # one connection per request in flight

            await one(http, server.url)  # on the first shard, on a connection it kept
            assert len(http.shards) == 3
            assert server.ports[-1] in server.ports[:10]
            assert len(set(server.ports)) == 10

    asyncio.run(run())


def test_a_failed_request_gives_its_place_back(server: Server) -> None:
    async def run() -> None:
        async with shards(2) as http:
            with pytest.raises(httpx.ConnectError):
                await http.post(f"http://127.0.0.1:{free_port()}/nothing")
            assert http.in_flight == [0]
            with pytest.raises(RuntimeError):
                async with http.stream("POST", server.url):
                    raise RuntimeError("the caller fails mid-stream")
            assert http.in_flight == [0]
            server.gate.set()
            assert await one(http, server.url) == "done\n"
            assert len(http.shards) == 1
        with pytest.raises(RuntimeError):  # closed: nothing new is opened
            await one(http, server.url)
        assert http.shards == []

    asyncio.run(run())


def test_shard_size_must_be_positive() -> None:
    with pytest.raises(ValueError):
        shards(0)
