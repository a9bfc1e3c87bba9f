"""A whole deployment in simulated time: one router, prefill and decode nodes, the network
between them, and the requests of a workload from arrival to last token."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tandem.engine.block_hash import hash_blocks
from tandem.engine.config import SchedulerConfig
from tandem.engine.request import Request
from tandem.engine.sampling_params import SamplingParams
from tandem.router.preprocess import Prompt
from tandem.router.workers import WorkerAddress, WorkerState
from tandem.sim.decode import SimDecode
from tandem.sim.events import EventQueue
from tandem.sim.node import SimNode
from tandem.sim.prefill import SimPrefill
from tandem.sim.profiles import DeviceProfile
from tandem.sim.router import ZMQ_PORT, SimRouter
from tandem.sim.shapes import ModelShape
from tandem.sim.step_model import StepTimeModel
from tandem.sim.transfer_model import TransferModel
from tandem.sim.workload import SimRequest


@dataclass(frozen=True)
class ClusterConfig:
    """The deployment: pool sizes and TP per role, routing, the remote-prefill threshold,
    and each node's engine limits. `num_prefill == 0` is an aggregated deployment (decode
    nodes prefill everything themselves). `num_kv_blocks` None: as many as fit the device."""

    num_prefill: int = 1
    num_decode: int = 1
    policy: str = "kv-aware"
    remote_prefill_threshold: int = 0
    tp_prefill: int = 1
    tp_decode: int = 1
    block_size: int = 16
    num_kv_blocks: int | None = None
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    max_model_len: int = 8192

    def __post_init__(self) -> None:
        if self.num_decode < 1 or self.num_prefill < 0:
            raise ValueError("a deployment needs a decode node (and no negative prefill count)")
        if self.remote_prefill_threshold < 0:
            raise ValueError("remote_prefill_threshold must be >= 0")

    @property
    def num_devices(self) -> int:
        return self.num_prefill * self.tp_prefill + self.num_decode * self.tp_decode


@dataclass
class RequestRecord:
    """One request's outcome; times in simulated seconds."""

    request_id: str
    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    decode: str = ""
    prefill: str | None = None
    remote: bool | None = None  # None until admitted
    admitted_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    num_cached_tokens: int = 0  # the decode node's prefix-cache hit
    num_prefill_cached_tokens: int = 0  # the prefill worker's own hit (remote only)
    num_preemptions: int = 0


@dataclass
class _Live:
    record: RequestRecord
    decode: WorkerState
    prefill: WorkerState | None
    tokens: int = 0


class Cluster:
    def __init__(
        self, config: ClusterConfig, shape: ModelShape, profile: DeviceProfile, seed: int = 0
    ) -> None:
        self.config = config
        self.shape = shape
        self.profile = profile
        self.events = EventQueue()
        self.num_stepping = 0  # nodes in the middle of a step
        self.records: dict[str, RequestRecord] = {}
        self._live: dict[str, _Live] = {}
        sched = SchedulerConfig(
            config.max_num_batched_tokens, config.max_num_seqs, config.max_model_len
        )
        self.decodes = [
            self._node(SimDecode, f"http://decode-{i}:8000", "decode", sched, config.tp_decode)
            for i in range(config.num_decode)
        ]
        self.prefills = [
            self._node(SimPrefill, f"http://prefill-{i}:8000", "prefill", sched, config.tp_prefill)
            for i in range(config.num_prefill)
        ]
        for p in self.prefills:
            p.setup_transfers(TransferModel(shape, profile, config.block_size, config.tp_prefill))
        self.nodes: dict[str, SimNode] = {n.url: n for n in (*self.decodes, *self.prefills)}
        self._by_endpoint = {
            f"tcp://prefill-{i}:{ZMQ_PORT}": p for i, p in enumerate(self.prefills)
        }
        addresses = [WorkerAddress(url, n.role) for url, n in self.nodes.items()]
        self.router = SimRouter(
            config.policy, config.block_size, addresses, self._snapshot, self.send
        )

    def _node(self, cls: type, url: str, role: str, sched: SchedulerConfig, tp: int) -> Any:
        model = StepTimeModel(self.shape, self.profile, tp)
        c = self.config
        num_blocks = c.num_kv_blocks or model.kv_blocks_per_device(c.block_size)
        threshold = c.remote_prefill_threshold if role == "decode" else 0
        return cls(self, url, role, sched, c.block_size, num_blocks, model, threshold)

    # -- plumbing -------------------------------------------------------------------------

    def send(self, callback: Callable[..., None], *args: Any) -> None:
        """Deliver a message after one network hop."""
        self.events.after(self.profile.network_latency_s, callback, *args)

    def contention(self) -> float:
        """How much longer a step starting now takes on shared host cores (1: no sharing)."""
        cores = self.profile.host_cores
        return max(1.0, self.num_stepping / cores) if cores else 1.0

    def prefill_at(self, endpoint: str | None) -> SimPrefill:
        return self._by_endpoint[endpoint]

    def _snapshot(self, url: str) -> tuple[str, int, list[int]]:
        node = self.nodes[url]
        return node.agent, node.seq, list(node.kv.pool.cached)

    # -- a request's life -----------------------------------------------------------------

    def run(self, requests: Sequence[SimRequest]) -> list[RequestRecord]:
        """Simulate the workload to the end; the records in arrival order."""
        for r in sorted(requests, key=lambda r: r.arrival_s):
            self.events.at(r.arrival_s, self._arrive, r)
        self.events.run()
        return sorted(self.records.values(), key=lambda r: r.arrival_s)

    def _arrive(self, r: SimRequest) -> None:
        token_ids = r.token_ids()
        hashes = hash_blocks(token_ids, self.config.block_size)
        prompt = Prompt(token_ids, None, tuple(hashes))
        route, decode, prefill = self.router.route(prompt)
        record = RequestRecord(r.request_id, self.events.now, len(token_ids), r.num_output_tokens)
        record.decode = route.decode.url
        record.prefill = route.prefill.url if route.prefill else None
        self.records[r.request_id] = record
        self._live[r.request_id] = _Live(record, decode, prefill)
        request = Request(
            r.request_id, token_ids, SamplingParams(max_tokens=r.num_output_tokens, ignore_eos=True)
        )
        request.block_hashes = hashes  # what the node's KV manager computes from the tokens
        request.prefill_worker = route.prefill.endpoint if route.prefill else None
        self.send(self.nodes[route.decode.url].add, request)

    def on_admitted(self, request: Request, remote: bool) -> None:
        record = self.records[request.request_id]
        if record.admitted_s is None:
            record.admitted_s = self.events.now
            record.remote = remote
            record.num_cached_tokens = request.num_cached_tokens

    def on_prefilled(self, request_id: str, num_cached_tokens: int) -> None:
        self.records[request_id].num_prefill_cached_tokens = num_cached_tokens

    def on_token(self, request: Request) -> None:
        """A token reached the client one hop after the decode node made it."""
        live = self._live[request.request_id]
        record, now = live.record, self.events.now + self.profile.network_latency_s
        live.tokens += 1
        if record.first_token_s is None:
            record.first_token_s = now
            if live.prefill is not None:
                live.prefill.inflight -= 1
        if request.is_finished:
            record.finish_s = now
            record.num_preemptions = request.num_preemptions
            live.decode.inflight -= 1
            del self._live[request.request_id]

    def check_integrity(self) -> None:
        """Every node's KV invariants (AssertionError on a violation)."""
        for node in self.nodes.values():
            node.kv.check_integrity()
