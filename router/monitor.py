"""Keeps the worker pool true: discovery, health checks, and one KV-event subscription per
worker (which also carries its load). Runs as tasks on the router's event loop.

Each round asks discovery for the addresses, checks every worker's `/health` (a worker is
ejected after `EJECT_AFTER` failures in a row and back at the first success; a check fails
when refused, answered with an error, or unanswered after `timeout_s`), and
(re)subscribes to a worker's events when its endpoint or agent changed (a restart).

A KV snapshot that still leaves a hole in the worker's events is asked for again by a later
round, after a backoff that doubles with each attempt (`interval_s`, then twice that, and so
on); the index bounds the attempts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Protocol

import httpx
import msgspec
import zmq
import zmq.asyncio

from tandem.engine.api.kv_events import decode_batch, decode_snapshot
from tandem.router.http_pool import ClientShards
from tandem.router.kv_index import PrefixIndex
from tandem.router.metrics import RouterMetrics
from tandem.router.workers import WorkerAddress, WorkerPool

logger = logging.getLogger(__name__)


class Discovery(Protocol):
    async def addresses(self) -> list[WorkerAddress]:
        """The workers that exist now (healthy or not)."""
        ...


class Subscription:
    """One SUB socket on one worker's events endpoint, read by one task."""

    def __init__(self, monitor: WorkerMonitor, url: str, endpoint: str, agent: str) -> None:
        self.endpoint, self.agent = endpoint, agent
        self.socket = monitor.context.socket(zmq.SUB)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SUBSCRIBE, b"")
        self.socket.connect(endpoint)
        self.task = asyncio.create_task(monitor.read_events(url, self.socket))

    def close(self) -> None:
        self.task.cancel()
        self.socket.close(0)


class WorkerMonitor:
    def __init__(
        self,
        pool: WorkerPool,
        index: PrefixIndex,
        discovery: Discovery,
        http: httpx.AsyncClient | ClientShards,
        interval_s: float = 1.0,
        metrics: RouterMetrics | None = None,
        timeout_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`metrics`, when given, counts the restarts seen (`worker_restarts`);
        `timeout_s` bounds each health check, whatever the interval; `clock` times the
        snapshot retries."""
        self.pool = pool
        self.index = index
        self.discovery = discovery
        self.http = http
        self.interval_s = interval_s
        self.metrics = metrics
        self.timeout_s = timeout_s
        self.context = zmq.asyncio.Context()
        self.subscriptions: dict[str, Subscription] = {}
        self.first_round = asyncio.Event()
        self.clock = clock
        self._resyncs: set[asyncio.Task] = set()  # strong references until done
        self.resync_due: dict[str, float] = {}  # url -> when to ask for a snapshot again

    async def run(self) -> None:
        while True:
            try:
                await self.check_once()
            except Exception:  # a bad round must not end monitoring
                logger.exception("worker monitoring round failed")
            self.first_round.set()
            await asyncio.sleep(self.interval_s)

    async def check_once(self) -> None:
        _, removed = self.pool.update(await self.discovery.addresses())
        for url in removed:
            self._unsubscribe(url)
        urls = list(self.pool.workers)
        await asyncio.gather(*(self._check(url) for url in urls))
        self._retry_due_resyncs()

    def _retry_due_resyncs(self) -> None:
        now = self.clock()
        for url, due in list(self.resync_due.items()):
            if due <= now:
                del self.resync_due[url]
                self._start_resync(url)

    async def _check(self, url: str) -> None:
        try:
            r = await self.http.get(f"{url}/health", timeout=self.timeout_s)
            info = r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            info = None
        if url not in self.pool.workers:
            return  # removed while we waited
        if info is None:
            self.pool.health_failed(url)
            return
        if self.pool.health_ok(url, info):
            logger.warning("worker %s restarted (agent %s)", url, info.get("agent"))
            if self.metrics is not None:
                role = self.pool.workers[url].address.role
                m = self.metrics
                m.child(m.worker_restarts, worker=url, worker_role=role).inc()
        self._subscribe(url)

    def _subscribe(self, url: str) -> None:
        worker = self.pool.workers[url]
        endpoint, agent = worker.events_endpoint, worker.agent
        current = self.subscriptions.get(url)
        if endpoint is None or (current and (current.endpoint, current.agent) == (endpoint, agent)):
            return
        self._unsubscribe(url)
        self.subscriptions[url] = Subscription(self, url, endpoint, agent)

    def _unsubscribe(self, url: str) -> None:
        sub = self.subscriptions.pop(url, None)
        if sub is not None:
            sub.close()
        self.index.forget(url)
        self.resync_due.pop(url, None)

    async def read_events(self, url: str, socket: zmq.asyncio.Socket) -> None:
        while True:
            data = await socket.recv()
            try:
                batch = decode_batch(data)
            except msgspec.DecodeError:
                logger.warning("undecodable KV event from %s", url)
                continue
            worker = self.pool.workers.get(url)
            if worker is not None:
                worker.load = batch.load
            if self.index.apply(url, batch):
                self.resync_due.pop(url, None)
                self._start_resync(url)

    def _start_resync(self, url: str) -> None:
        task = asyncio.create_task(self._resync(url))
        self._resyncs.add(task)
        task.add_done_callback(self._resyncs.discard)

    async def _resync(self, url: str) -> None:
        try:
            r = await self.http.get(f"{url}/kv/snapshot", timeout=5)
            r.raise_for_status()
            snap = decode_snapshot(r.content)
            again = self.index.load_snapshot(
                url, snap.node, snap.seq, snap.hashes, snap.host_hashes, snap.disk_hashes
            )
        except (httpx.HTTPError, ValueError) as exc:  # msgspec.DecodeError is a ValueError
            logger.warning("KV snapshot from %s failed: %s", url, exc)
            self.index.resync_failed(url)
            return
        if again:
            node = self.index.nodes[url]
            backoff = self.interval_s * 2 ** (node.num_resync_attempts - 2)
            self.resync_due[url] = self.clock() + backoff

    def close(self) -> None:
        for url in list(self.subscriptions):
            self._unsubscribe(url)
        with contextlib.suppress(Exception):
            self.context.term()
