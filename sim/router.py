"""The simulated router: the real `WorkerPool`, `PrefixIndex` and `Dispatcher.route` (the
policy on a snapshot of the workers), fed by the simulated nodes' KV events."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry

from tandem.engine.api.kv_events import KVEventBatch, KVSnapshot
from tandem.router.dispatch import Dispatcher, WorkerFailed
from tandem.router.errors import APIError
from tandem.router.kv_index import PrefixIndex
from tandem.router.metrics import RouterMetrics
from tandem.router.policy import POLICIES, Route
from tandem.router.preprocess import Prompt
from tandem.router.workers import WorkerAddress, WorkerPool, WorkerState

# Where a simulated worker's prefill requests go, as the router hands it to decode nodes.
ZMQ_PORT = 5555

Snapshotter = Callable[[str], KVSnapshot | None]


def decode_url(index: int) -> str:
    return f"http://decode-{index}:8000"


def prefill_url(index: int) -> str:
    return f"http://prefill-{index}:8000"


def prefill_endpoint(index: int) -> str:
    """Where decode nodes send prefill worker `index` its requests."""
    return f"tcp://prefill-{index}:{ZMQ_PORT}"


def prefill_index(endpoint: str) -> int:
    """`tcp://prefill-3:5555` -> 3."""
    host = endpoint.removeprefix("tcp://").split(":")[0]
    return int(host.removeprefix("prefill-"))


class SimRouter:
    def __init__(
        self,
        policy: str,
        block_size: int,
        workers: Sequence[WorkerAddress],
        agents: Sequence[str],
        snapshot: Snapshotter,
        send: Callable[..., None],
    ) -> None:
        """`agents`: the workers' agent names, as their `/health` says;
        `snapshot(url)`: the node's hashes of every tier, as `GET /kv/snapshot` answers
        (None: it does not answer); `send(callback, *args)`: deliver after one network hop."""
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
        self.pool = WorkerPool()
        self.pool.update(list(workers))
        for w, agent in zip(workers, agents):
            self.pool.health_ok(w.url, {"role": w.role, "agent": agent, "zmq_port": ZMQ_PORT})
        self.index = PrefixIndex()
        metrics = RouterMetrics(CollectorRegistry(), "sim", "sim-router")
        self.dispatcher = Dispatcher(
            self.pool, self.index, POLICIES[policy], None, metrics, block_size
        )
        self._snapshot = snapshot
        self._send = send
        self.num_resyncs = 0

    def route(
        self, prompt: Prompt, exclude: frozenset[str] = frozenset()
    ) -> tuple[Route, WorkerState, WorkerState | None]:
        """Pick the workers, without the decode workers `exclude` (those tried), and count
        the request in flight on them (as `_attempt` does). `Unavailable`: no decode worker."""
        route = self.dispatcher.route(prompt, exclude)
        decode = self.pool.workers[route.decode.url]
        prefill = self.pool.workers[route.prefill.url] if route.prefill else None
        for state in (decode, prefill):
            if state is not None:
                state.inflight += 1
        return route, decode, prefill

    def on_failure(
        self, url: str, exc: WorkerFailed, streamed: bool, num_tried: int
    ) -> APIError | None:
        """`Dispatcher.on_failure`: the decode worker at `url` failed a request; the error
        that ends it, or None to retry elsewhere."""
        return self.dispatcher.on_failure(url, exc, streamed, num_tried)

    def retries(self) -> dict[str, int]:
        """`tandem_router_retries_total` by reason, as the router counted it."""
        counts: dict[str, int] = {}
        for metric in self.dispatcher.metrics.retries.collect():
            for sample in metric.samples:
                if sample.name.endswith("_total") and sample.value:
                    counts[sample.labels["reason"]] = int(sample.value)
        return dict(sorted(counts.items()))

    def on_kv_events(self, url: str, batch: KVEventBatch) -> None:
        """As `WorkerMonitor.read_events`: take the load, apply the batch, resync on a gap."""
        self.pool.workers[url].load = batch.load
        if self.index.apply(url, batch):
            self.num_resyncs += 1
            self._send(self._resync, url)

    def _resync(self, url: str) -> None:
        snapshot = self._snapshot(url)
        if snapshot is None:
            self._send(self.index.resync_failed, url)
            return
        self._send(self._load_snapshot, url, snapshot)

    def _load_snapshot(self, url: str, s: KVSnapshot) -> None:
        """As `WorkerMonitor._resync`: every tier's hashes, then the buffered batches; a
        hole left between them is asked for again."""
        if self.index.load_snapshot(url, s.node, s.seq, s.hashes, s.host_hashes, s.disk_hashes):
            self.num_resyncs += 1
            self._send(self._resync, url)

    def check_health(self, url: str, agent: str | None) -> None:
        """One `GET /health` (`WorkerMonitor._check`): `agent` None when it fails. A new
        agent is a restart: the index forgets the worker until its events resync it."""
        if agent is None:
            self.pool.health_failed(url)
            return
        role = self.pool.workers[url].address.role
        if self.pool.health_ok(url, {"role": role, "agent": agent, "zmq_port": ZMQ_PORT}):
            self.index.forget(url)
