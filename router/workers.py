"""The router's view of its workers: what discovery found, what health checks and KV events
said, and how many requests the router itself has in flight on each.

`WorkerPool` is touched only from the router's event loop. `snapshot()` copies it into
frozen `WorkerView`s for the routing policy, which never sees mutable state.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from tandem.engine.api.kv_events import Load
from tandem.router.kv_index import NO_MATCH, PrefixMatch

logger = logging.getLogger(__name__)

# Consecutive failed health checks before a worker is ejected.
EJECT_AFTER = 2


@dataclass(frozen=True)
class WorkerAddress:
    """What discovery yields: where a worker's HTTP API is and which role it serves."""

    url: str
    role: str  # "prefill" or "decode"


@dataclass(frozen=True)
class WorkerView:
    """One worker as a routing policy sees it, for one request."""

    url: str
    role: str
    revision: str
    endpoint: str | None  # prefill: the ZMQ endpoint decode nodes send prefill requests to
    running: int = 0
    waiting: int = 0
    free_blocks: int = 0
    total_blocks: int = 0
    inflight: int = 0  # this router's requests on it now
    overlap_blocks: int = 0  # leading prompt blocks it has cached, in any tier (KV events)
    host_blocks: int = 0  # of those, the ones found in host memory and not on the device
    disk_blocks: int = 0  # and the ones found on disk, in neither of the others

    @property
    def device_blocks(self) -> int:
        return self.overlap_blocks - self.host_blocks - self.disk_blocks

    @property
    def pending(self) -> int:
        """Requests queued or running there: the node's own count, or the router's when
        fresher (the node's counts lag by one event batch)."""
        return max(self.inflight, self.running + self.waiting)


@dataclass
class WorkerState:
    address: WorkerAddress
    healthy: bool = False
    failures: int = 0
    info: dict[str, Any] = field(default_factory=dict)  # the last /health body
    load: Load | None = None
    inflight: int = 0
    ejections: int = 0  # by its health checks, counted so that its open streams see one
    # the reads in progress on its streams (`stream_reads.bounded_lines`): expired when
    # the health checks eject it, so that its streams end instead of waiting on it
    open_reads: set[asyncio.Timeout] = field(default_factory=set)

    @property
    def url(self) -> str:
        return self.address.url

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or "127.0.0.1"

    @property
    def revision(self) -> str:
        return str(self.info.get("revision") or "")

    @property
    def agent(self) -> str | None:
        return self.info.get("agent")

    @property
    def events_endpoint(self) -> str | None:
        port = self.info.get("events_port")
        return f"tcp://{self.host}:{port}" if port else None

    @property
    def endpoint(self) -> str | None:
        port = self.info.get("zmq_port")
        return f"tcp://{self.host}:{port}" if port and self.address.role == "prefill" else None

    @property
    def metrics_url(self) -> str | None:
        """The node's /metrics, on its metrics port (reported by its /health)."""
        port = self.info.get("metrics_port")
        return f"http://{self.host}:{port}/metrics" if port else None

    def describe(self) -> dict[str, Any]:
        """The `/workers` entry."""
        load = self.load
        return {
            "role": self.address.role,
            "url": self.url,
            "metrics_url": self.metrics_url,
            "healthy": self.healthy,
            "revision": self.info.get("revision"),
            "agent": self.agent,
            "load": {
                "inflight": self.inflight,
                "running": load.running if load else None,
                "waiting": load.waiting if load else None,
                "free_blocks": load.free_blocks if load else None,
                "total_blocks": load.total_blocks if load else None,
            },
        }


class WorkerPool:
    """Every known worker by URL."""

    def __init__(self) -> None:
        self.workers: dict[str, WorkerState] = {}
        # a decode worker was healthy once: the router is ready from then on (an outage
        # then answers 503 with Retry-After, not a refused connection)
        self.served = False

    def update(self, addresses: list[WorkerAddress]) -> tuple[list[str], list[str]]:
        """Set the known workers to `addresses`; returns the URLs (added, removed).

        A healthy worker that discovery no longer lists stays while no other worker of its
        role is healthy: in a rollout, one discovery round can both drop the old pod (now
        draining, still serving) and add its replacement (not yet health-checked); without
        this, requests in between found no decode worker. It goes once another of its role
        is healthy, or when its own health checks fail."""
        wanted = {a.url: a for a in addresses}
        gone = [url for url, w in self.workers.items() if wanted.get(url) != w.address]
        removed = [url for url in gone if url in wanted or not self._last_healthy(url, gone)]
        for url in removed:
            del self.workers[url]
        added = [url for url in wanted if url not in self.workers]
        for url in added:
            self.workers[url] = WorkerState(wanted[url])
        return added, removed

    def _last_healthy(self, url: str, gone: list[str]) -> bool:
        """`url` is healthy and no worker of its role that stays is."""
        worker = self.workers[url]
        role = worker.address.role
        return worker.healthy and not any(
            w.healthy and w.address.role == role and u not in gone for u, w in self.workers.items()
        )

    def health_ok(self, url: str, info: dict[str, Any]) -> bool:
        """Record a good /health; returns whether the worker restarted (a new agent)."""
        worker = self.workers[url]
        if info.get("role") != worker.address.role:
            logger.warning(
                "%s says it is a %s node, not %s", url, info.get("role"), worker.address.role
            )
            self.health_failed(url, eject=True)
            return False
        restarted = worker.agent is not None and worker.agent != info.get("agent")
        if not worker.healthy:
            logger.info("worker %s is healthy", url)
        worker.healthy, worker.failures, worker.info = True, 0, info
        self.served = self.served or worker.address.role == "decode"
        return restarted

    def health_failed(self, url: str, eject: bool = False) -> None:
        """Count a failure; eject after EJECT_AFTER in a row (or at once with `eject`,
        when a request to it just failed). An ejection by the health checks also ends the
        reads in progress on its open streams; one request failing does not end the
        others (a worker that is gone ends them itself)."""
        worker = self.workers.get(url)
        if worker is None:
            return
        worker.failures += 1
        if worker.healthy and (eject or worker.failures >= EJECT_AFTER):
            logger.warning("worker %s ejected after %d failure(s)", url, worker.failures)
            worker.healthy = False
            if not eject:
                _end_streams(worker)

    def snapshot(
        self, matches: dict[str, PrefixMatch], exclude: frozenset[str] = frozenset()
    ) -> tuple[tuple[WorkerView, ...], tuple[WorkerView, ...]]:
        """Healthy workers as (prefill, decode) views, sorted by URL, without `exclude`.

        When no decode worker is healthy, the decode views are the ejected ones that were
        healthy before (panic routing): one slow health check or one broken connection
        ejects a busy worker that still serves, and trying it beats refusing the request.
        A worker that never answered is never tried."""
        views: dict[str, list[WorkerView]] = {"prefill": [], "decode": []}
        ejected: list[WorkerView] = []
        for url in sorted(self.workers):
            w = self.workers[url]
            if url in exclude:
                continue
            if w.healthy:
                views[w.address.role].append(_view(w, matches))
            elif w.address.role == "decode" and w.agent is not None:
                ejected.append(_view(w, matches))
        return tuple(views["prefill"]), tuple(views["decode"] or ejected)


def _end_streams(worker: WorkerState) -> None:
    worker.ejections += 1
    for scope in worker.open_reads:
        scope.reschedule(0)  # expired: its read raises TimeoutError now


def _view(w: WorkerState, matches: dict[str, PrefixMatch]) -> WorkerView:
    load = w.load or Load(0, 0, 0, 0)
    match = matches.get(w.url, NO_MATCH)
    return WorkerView(
        w.url,
        w.address.role,
        w.revision,
        w.endpoint,
        load.running,
        load.waiting,
        load.free_blocks,
        load.total_blocks,
        w.inflight,
        match.num_blocks,
        match.host_blocks,
        match.disk_blocks,
    )
