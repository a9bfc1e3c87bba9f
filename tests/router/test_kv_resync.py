"""The monitor's KV resync: a snapshot that leaves a hole is asked for again by a later
monitoring round, after a backoff on the monitor's clock, until one fits."""

from __future__ import annotations

import asyncio

import httpx
import msgspec

from tandem.engine.api.kv_events import KVEventBatch, Load
from tandem.router.discovery import StaticDiscovery
from tandem.router.kv_index import PrefixIndex, PrefixMatch
from tandem.router.monitor import WorkerMonitor
from tandem.router.workers import WorkerPool

URL = "http://d:1"
LOAD = Load(0, 0, 10, 10)


class FakeSocket:
    """Delivers queued KV-event batches to `WorkerMonitor.read_events`."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()

    def send(self, seq: int, stored: list[int]) -> None:
        batch = KVEventBatch(seq, "agent-a", stored, [], LOAD)
        self.queue.put_nowait(msgspec.msgpack.encode(batch))

    async def recv(self) -> bytes:
        return await self.queue.get()


async def until(condition) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0)  # yield to the monitor's tasks

    await asyncio.wait_for(poll(), 30)  # a guard against a hang, not a timing


def test_a_snapshot_with_a_hole_is_asked_for_again_after_a_backoff():
    snapshots = [(3, [1]), (3, [1]), (5, [1, 2, 3])]  # the third one fits
    asked = []
    now = [100.0]

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200, json={"role": "decode", "agent": "agent-a"})
        asked.append(now[0])
        seq, hashes = snapshots[len(asked) - 1]
        return httpx.Response(200, json={"node": "agent-a", "seq": seq, "hashes": hashes})

    async def go() -> None:
        index = PrefixIndex()
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            discovery = StaticDiscovery([], [URL])
            monitor = WorkerMonitor(
                WorkerPool(), index, discovery, http, interval_s=1.0, clock=lambda: now[0]
            )
            await monitor.check_once()
            socket = FakeSocket()
            reader = asyncio.create_task(monitor.read_events(URL, socket))
            socket.send(5, [9])  # first contact: asks at once
            await until(lambda: URL in monitor.resync_due)  # hole (3 then 5): retry due
            assert asked == [100.0]
            await monitor.check_once()  # not due yet: nothing asked
            assert len(asked) == 1
            now[0] = 101.0
            await monitor.check_once()
            await until(lambda: len(asked) == 2 and URL in monitor.resync_due)
            assert monitor.resync_due[URL] == 103.0  # the backoff doubles
            socket.send(6, [4])
            now[0] = 103.0
            await monitor.check_once()
            await until(lambda: not index.nodes[URL].resyncing)
            assert index.overlap(URL, [1, 2, 3, 4]) == 4  # batch 6 replayed on top
            assert len(asked) == 3
            reader.cancel()
            monitor.close()

    asyncio.run(go())


def test_a_snapshot_loads_every_tier_and_a_malformed_one_forgets_the_worker():
    bodies = [
        {"node": "agent-a", "seq": 5, "hashes": [1], "host_hashes": [2], "disk_hashes": [3]},
        {"node": "agent-a", "seq": 5, "host_hashes": [2]},  # no device hashes
    ]

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200, json={"role": "decode", "agent": "agent-a"})
        return httpx.Response(200, json=bodies.pop(0))

    async def go() -> None:
        index = PrefixIndex()
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            discovery = StaticDiscovery([], [URL])
            monitor = WorkerMonitor(WorkerPool(), index, discovery, http, interval_s=1.0)
            await monitor.check_once()
            socket = FakeSocket()
            reader = asyncio.create_task(monitor.read_events(URL, socket))
            socket.send(5, [])  # first contact: asks at once
            await until(lambda: URL in index.nodes and not index.nodes[URL].resyncing)
            assert index.match(URL, [1, 2, 3]) == PrefixMatch(1, 1, 1)
            socket.send(7, [])  # a gap: asks again, and gets the malformed body
            await until(lambda: not bodies and URL not in index.nodes)
            reader.cancel()
            monitor.close()

    asyncio.run(go())
