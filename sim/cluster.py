"""A whole deployment in simulated time: one router, prefill and decode nodes, the network
between them, and the requests of a workload from arrival to last token."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tandem.engine.api.kv_events import KVSnapshot
from tandem.engine.core.block_hash import hash_blocks
from tandem.engine.core.config import SchedulerConfig
from tandem.engine.core.request import Request
from tandem.engine.core.sampling_params import SamplingParams
from tandem.router.dispatch import WorkerFailed
from tandem.router.errors import APIError, Unavailable
from tandem.router.phase_metrics import ChoiceClock
from tandem.router.preprocess import Prompt
from tandem.router.workers import WorkerAddress, WorkerState
from tandem.sim.cluster_config import ClusterConfig
from tandem.sim.decode import SimDecode
from tandem.sim.events import EventQueue
from tandem.sim.faults import Faults
from tandem.sim.host_process import HostProcess, host_cores
from tandem.sim.node import SAMPLED_TOKEN, SimNode
from tandem.sim.outages import Outages
from tandem.sim.prefill import SimPrefill
from tandem.sim.profiles import DeviceProfile
from tandem.sim.router import (
    SimRouter,
    decode_url,
    prefill_endpoint,
    prefill_index,
    prefill_url,
)
from tandem.sim.shapes import ModelShape
from tandem.sim.step_model import StepTimeModel
from tandem.sim.step_spread import StepSpread
from tandem.sim.transfer_model import TransferModel
from tandem.sim.workload import SimRequest

if TYPE_CHECKING:
    from tandem.sim.slo_watch import SLOWatch


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
    outcome: str | None = None  # "finished", "aborted" (by the client) or "error"
    error: str | None = None  # the router's error (`APIError.reason`) when "error"
    ended_s: float | None = None  # when the client saw the end (any outcome)
    fallbacks: list[str] = field(default_factory=list)  # reasons, one per failed attempt
    # one per decode worker that failed it, as the router labels its retries:
    # "decode_failed" (the worker's fault: it died) or "prefill_failed" (its remote prefill)
    worker_failures: list[str] = field(default_factory=list)
    # where its time went, as the router's `tandem_request_phase_seconds` splits it
    # (`ChoiceClock.phases`), set when the router saw it end
    phases: dict[str, float] = field(default_factory=dict)


@dataclass
class _Live:
    """The router's side of one request (`Dispatcher.records`): the decode workers tried,
    and the current attempt's workers (counted in flight) and request."""

    record: RequestRecord
    prompt: Prompt
    num_output_tokens: int
    tried: list[str] = field(default_factory=list)
    attempt: int = 0
    request: Request | None = None
    node: SimDecode | None = None  # the node that took the current attempt
    decode: WorkerState | None = None
    prefill: WorkerState | None = None  # until the first token
    tokens: int = 0
    clock: ChoiceClock | None = None  # the router's, from its first routing
    timings: dict[str, float] | None = None  # the decode node's, for the current attempt


class Cluster:
    """Owns the event queue, the nodes and the router; `faults` says what goes wrong."""

    def __init__(
        self,
        config: ClusterConfig,
        shape: ModelShape,
        profile: DeviceProfile,
        seed: int = 0,
        faults: Faults | None = None,
        watch: SLOWatch | None = None,
    ) -> None:
        """`watch`: stops the run once the SLOs are lost (`tandem plan`)."""
        self.config = config
        self.watch = watch
        self.shape = shape
        self.profile = profile
        self.faults = faults or Faults()
        self.events = EventQueue()
        self.cores = host_cores(self.events, profile)
        self.spread = StepSpread(seed)  # the steps' spread around the model, if any
        # on a CPU host, the router's event loop and the clients' (one process each)
        self.router_process = HostProcess(self.cores)
        self.client_process = HostProcess(self.cores)
        self.num_hold_timeouts = 0  # holds past their deadline unconfirmed (quarantined or freed)
        self.records: dict[str, RequestRecord] = {}
        self._live: dict[str, _Live] = {}
        self._sched = SchedulerConfig(
            config.max_num_batched_tokens, config.max_num_seqs, config.max_model_len
        )
        self.prefills = [self.new_prefill(i) for i in range(config.num_prefill)]
        self.decodes = [self.new_decode(i) for i in range(config.num_decode)]
        self.retired: list[SimNode] = []  # nodes that died and restarted, for their figures
        self.nodes: dict[str, SimNode] = {n.url: n for n in (*self.decodes, *self.prefills)}
        addresses = [WorkerAddress(url, n.role) for url, n in self.nodes.items()]
        agents = [n.agent for n in self.nodes.values()]
        self.router = SimRouter(
            config.policy, config.block_size, addresses, agents, self._snapshot, self.send
        )
        self.outages = Outages(self)

    def _node(self, cls: type, url: str, role: str, tp: int) -> Any:
        model = StepTimeModel(self.shape, self.profile, tp, role)
        c = self.config
        num_blocks = c.num_kv_blocks or model.kv_blocks_per_device(c.block_size)
        threshold = c.remote_prefill_threshold if role == "decode" else 0
        return cls(self, url, role, self._sched, c.block_size, num_blocks, model, threshold)

    def new_decode(self, index: int) -> SimDecode:
        """A fresh decode node `index` (empty cache, no requests); its connections to the
        prefill workers that are down fail, as a new `PrefillClient`'s would."""
        node = self._node(SimDecode, decode_url(index), "decode", self.config.tp_decode)
        node.setup_failover(self.config.failover)
        node.down = {prefill_endpoint(i) for i, p in enumerate(self.prefills) if p.dead}
        return node

    def new_prefill(self, index: int) -> SimPrefill:
        """A fresh prefill node `index` (empty cache, no jobs)."""
        c = self.config
        node = self._node(SimPrefill, prefill_url(index), "prefill", c.tp_prefill)
        transfer = TransferModel(self.shape, self.profile, c.block_size, c.tp_prefill, c.tp_decode)
        node.setup_transfers(transfer)
        return node

    # -- plumbing -------------------------------------------------------------------------

    def send(self, callback: Callable[..., None], *args: Any) -> None:
        """Deliver a message after one network hop."""
        self.events.after(self.profile.network_latency_s, callback, *args)

    def prefill_at(self, endpoint: str) -> SimPrefill:
        """The node at a prefill endpoint now (dead if it died and has not restarted)."""
        return self.prefills[prefill_index(endpoint)]

    def _snapshot(self, url: str) -> KVSnapshot | None:
        node = self.nodes[url]
        return None if node.dead else node.snapshot()  # a dead one's GET /kv/snapshot fails

    @property
    def all_prefills(self) -> list[SimPrefill]:
        return [*self.prefills, *(n for n in self.retired if isinstance(n, SimPrefill))]

    @property
    def all_decodes(self) -> list[SimDecode]:
        return [*self.decodes, *(n for n in self.retired if isinstance(n, SimDecode))]

    # -- a request's life -----------------------------------------------------------------

    def run(self, requests: Sequence[SimRequest]) -> list[RequestRecord]:
        """Simulate the workload to the end; the records in arrival order."""
        ordered = sorted(requests, key=lambda r: r.arrival_s)
        aborted = self.faults.aborted([r.request_id for r in ordered])
        for r in ordered:
            self.events.at(r.arrival_s, self._arrive, r)
            if r.request_id in aborted:
                self.events.at(r.arrival_s + self.faults.abort_after_s, self._abort, r.request_id)
        self.outages.schedule(self.faults.outages)
        self.events.run()
        return sorted(self.records.values(), key=lambda r: r.arrival_s)

    def _arrive(self, r: SimRequest) -> None:
        token_ids = r.token_ids()
        hashes = hash_blocks(token_ids, self.config.block_size)
        record = RequestRecord(r.request_id, self.events.now, len(token_ids), r.num_output_tokens)
        self.records[r.request_id] = record
        if self.watch:
            due = self.watch.first_token_deadline(record)
            self.events.at(due, self._due, self.watch.first_token_due, record)
        live = _Live(record, Prompt(token_ids, None, tuple(hashes)), r.num_output_tokens)
        self._live[r.request_id] = live
        self.client_process.submit(self.profile.host_client_request_s, self._to_router, live)

    def _to_router(self, live: _Live) -> None:
        """The client has sent the request; the router parses it before it routes it."""
        self.router_process.submit(self.profile.host_router_request_s, self._dispatch, live)

    def _dispatch(self, live: _Live) -> None:
        """One attempt of `Dispatcher.records`' loop: route without the decode workers
        tried, count it in flight, send it (`POST /generate`)."""
        if self._live.get(live.record.request_id) is not live:
            return  # the client went away before the router got to it
        try:
            route, decode, prefill = self.router.route(live.prompt, frozenset(live.tried))
        except Unavailable as exc:
            self._fail(live, exc)
            return
        record = live.record
        if live.clock is None:
            live.clock = ChoiceClock(self.events.now)
        live.tried.append(route.decode.url)
        live.attempt += 1
        live.decode, live.prefill, live.node = decode, prefill, None
        live.timings = None  # the new attempt's, when its decode node sends them
        record.decode = route.decode.url
        record.prefill = route.prefill.url if route.prefill else None
        record.admitted_s = record.remote = None  # the figures are the last attempt's
        token_ids = live.prompt.token_ids
        params = SamplingParams(max_tokens=live.num_output_tokens, ignore_eos=True)
        request = Request(record.request_id, token_ids, params)
        request.block_hashes = list(live.prompt.block_hashes)  # as the node computes them
        request.prefill_worker = route.prefill.endpoint if route.prefill else None
        live.request = request
        alternates = [p.endpoint for p in route.alternates if p.endpoint]
        # the write to the decode worker is a later turn of the router's loop than the
        # decision: the burst's next requests, the KV events that came meanwhile go first
        work_s = self.profile.host_router_forward_s
        self.router_process.submit(work_s, self.send, self._deliver, live, live.attempt, alternates)

    def _deliver(self, live: _Live, attempt: int, alternates: list[str]) -> None:
        """The request reaches the decode node at its URL now; a dead one refuses the
        connection, which the router hears one hop later."""
        if not self._current(live, attempt):
            return  # the client went away meanwhile
        node: SimDecode = self.nodes[live.record.decode]
        if node.dead:
            refused = WorkerFailed(f"{node.url}: connection refused")
            self.send(self._worker_failed, live, attempt, refused)
            return
        live.node = node
        work_s = self.profile.host_decode_request_s
        node.front.submit(work_s, self._admit, live, attempt, node, alternates)

    def _admit(self, live: _Live, attempt: int, node: SimDecode, alternates: list[str]) -> None:
        """The decode node's HTTP thread has taken the request: its engine adds it between
        steps (unless the client went away meanwhile; a node that died ignores it)."""
        if self._current(live, attempt):
            node.deliver(node.add_stream, live.request, alternates)

    def _current(self, live: _Live, attempt: int) -> bool:
        return self._live.get(live.record.request_id) is live and live.attempt == attempt

    def on_decode_death(self, node: SimDecode) -> None:
        """The router's streams to `node` break (the connection resets): it hears one hop
        later, for every request whose current attempt the node had taken."""
        for live in list(self._live.values()):
            if live.node is node:
                reset = WorkerFailed(f"{node.url}: connection reset")
                self.to_router_loop(self._worker_failed, live, live.attempt, reset)

    def to_router_loop(self, callback: Callable[..., None], *args: Any) -> None:
        """A node's word (a stream's end, a batch of KV events) reaches the router one hop
        later, behind what its event loop has not done yet (the tokens of a stream that
        broke, the routing of requests that came before it)."""
        self.send(self.router_process.submit, 0.0, callback, *args)

    def _worker_failed(self, live: _Live, attempt: int, exc: WorkerFailed) -> None:
        """`Dispatcher.records`' `except WorkerFailed`: the attempt's counts go (its
        `finally`), then the real policy ejects the worker and retries or ends the request.
        (The router's `POST /abort` to the failed worker is not sent: a dead node has nothing
        to free, and one that reported the failure has ended the request already.)"""
        if not self._current(live, attempt):
            return
        self._uncount(live)
        live.record.worker_failures.append(
            "decode_failed" if exc.worker_at_fault else "prefill_failed"
        )
        url, streamed = live.record.decode, live.tokens > 0
        error = self.router.on_failure(url, exc, streamed, len(live.tried))
        if error is None:
            self._dispatch(live)
        else:
            self._fail(live, error)

    def _fail(self, live: _Live, error: APIError) -> None:
        live.record.error = error.reason
        self._end(live, "error", self.events.now)

    def _abort(self, request_id: str) -> None:
        """The client goes away: the router stops counting the request and tells its decode
        node (`POST /abort`), unless it has ended."""
        live = self._live.get(request_id)
        if live is None:
            return
        self._end(live, "aborted", self.events.now)
        if not live.tried:
            return  # the router has not forwarded it yet
        node: SimDecode = self.nodes[live.record.decode]
        # `POST /abort` passes the node's HTTP thread too, behind the request it ends
        self.send(node.front.submit, 0.0, node.deliver, node.abort, request_id)

    def on_admitted(self, request: Request, remote: bool) -> None:
        live = self._live.get(request.request_id)
        if live is None or live.request is not request:
            return
        record = live.record
        if record.admitted_s is None:
            record.admitted_s = self.events.now
            record.remote = remote
            record.num_cached_tokens = request.num_cached_tokens

    def on_fallback(self, request_id: str, reason: str, local: bool) -> None:
        record = self.records[request_id]
        record.fallbacks.append(reason)
        if local:
            record.remote = False

    def on_timings(self, request: Request, timings: dict[str, float]) -> None:
        """The decode node's remote-prefill breakdown, which its first token carries."""
        live = self._live.get(request.request_id)
        if live is not None and live.request is request:
            live.timings = timings

    def on_prefilled(self, request_id: str, num_cached_tokens: int) -> None:
        self.records[request_id].num_prefill_cached_tokens = num_cached_tokens

    def relay(self, requests: list[Request]) -> None:
        """A decode node made a token for each of `requests`: they reach the router one hop
        later, behind what its event loop has queued (the router's view of the request
        moves then), and the client after its own turn."""
        if not requests:
            return
        finished = [r.is_finished for r in requests]  # as they were when the node made them
        router_s = len(requests) * self.profile.host_router_token_s
        self.router_process.submit(router_s, self._router_relays, requests, finished)

    def _router_relays(self, requests: list[Request], finished: list[bool]) -> None:
        """The router takes the tokens of its current attempts: streamed counts, the prefill
        part over at the first, the request over at the last; then the client reads them."""
        taken = []
        for request, last in zip(requests, finished):
            live = self._live.get(request.request_id)
            if live is None or live.request is not request:
                continue  # the client has gone, or the router gave up on this attempt
            live.tokens += 1
            self._clock_token(live, last)
            if live.prefill is not None:
                live.prefill.inflight -= 1  # the prefill part is over
                live.prefill = None
            if last:
                live.record.num_preemptions = request.num_preemptions
                self._end(live, "finished", self.events.now)
            taken.append((live.record, last))
        client_s = len(taken) * self.profile.host_client_token_s
        self.client_process.submit(client_s, self._tokens_arrive, taken)

    def _clock_token(self, live: _Live, last: bool) -> None:
        """The router's clock takes a token as `Generation` takes a record. (The real
        dispatcher stamps a record as it reads it, before its turn's work on the batch;
        here the stamp is after it: `other` carries up to one batch's relay work more.)"""
        live.clock.on_record({
            "token_ids": [SAMPLED_TOKEN],
            "finish_reason": "length" if last else None,
            "received_at": self.events.now,
            "timings": live.timings if live.tokens == 1 else None,
        })  # fmt: skip

    def _tokens_arrive(self, taken: list[tuple[RequestRecord, bool]]) -> None:
        """The client has read the tokens (one hop after the router sent them)."""
        now = self.events.now + self.profile.network_latency_s
        for record, last in taken:
            if record.first_token_s is None:
                record.first_token_s = now
                if self.watch:
                    self.watch.first_token(record)
                    if (due := self.watch.last_token_deadline(record)) is not None:
                        self.events.at(due, self._due, self.watch.last_token_due, record)
            if last:
                record.finish_s = record.ended_s = now
                if self.watch:
                    self.watch.finished(record)
        if self.watch and self.watch.lost:
            self.events.stop()

    def _due(self, check: Callable[[RequestRecord], None], record: RequestRecord) -> None:
        """A deadline of the SLO watch: `check` counts the request if it has not got there."""
        check(record)
        if self.watch and self.watch.lost:
            self.events.stop()

    def on_end(self, node: SimDecode, request_id: str, outcome: str) -> None:
        """The decode node ended the request without finishing it: `error` is an error
        record, which the router takes as a `WorkerFailed` not of the worker's making (its
        remote prefill failed, `error_source: prefill`); `aborted` is the client's."""
        live = self._live.get(request_id)
        if live is None or live.node is not node:
            return
        if outcome == "error":
            failed = WorkerFailed("remote prefill failed", worker_at_fault=False)
            self.to_router_loop(self._worker_failed, live, live.attempt, failed)
        else:
            self._end(live, outcome, self.events.now + self.profile.network_latency_s)

    def _end(self, live: _Live, outcome: str, now: float) -> None:
        """The router's view: the request is over, its in-flight counts go."""
        live.record.outcome, live.record.ended_s = outcome, now
        if self.watch and outcome != "finished":
            self.watch.ended_unfinished()
            self.events.stop()
        if live.clock is not None:
            live.record.phases = live.clock.phases()
        self._uncount(live)
        del self._live[live.record.request_id]
        # the rest of the request's work in the router and its client, in their turn
        self.router_process.submit(self.profile.host_router_finish_s, _nothing)
        self.client_process.submit(self.profile.host_client_finish_s, _nothing)

    @staticmethod
    def _uncount(live: _Live) -> None:
        """The attempt's in-flight counts go: decode, and prefill before the first token."""
        for state in (live.decode, live.prefill):
            if state is not None:
                state.inflight -= 1
        live.decode = live.prefill = None

    def check_integrity(self) -> None:
        """Every live node's KV invariants (AssertionError on a violation)."""
        for node in self.nodes.values():
            if not node.dead:
                node.kv.check_integrity()

    @property
    def num_held_blocks(self) -> int:
        """Blocks that live nodes still hold for transfers (0 once every hold resolved)."""
        return sum(n.kv.num_held_blocks for n in self.nodes.values() if not n.dead)


def _nothing() -> None:
    pass
