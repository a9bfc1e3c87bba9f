"""The scheduler: computed tokens catch up with each request's tokens, under a token budget.

There is no prefill phase and no decode phase. Each step, running requests take their next
tokens first (one for a decoding request, a chunk for a partly prefilled one), then waiting
requests are admitted in arrival order with what is left of the budget. When the pool runs
out of blocks, the newest running request is preempted: its blocks are freed and it is
recomputed later (prompt plus the tokens it already produced).

Disaggregated decode adds one path: a waiting request that names a prefill worker, with at
least `remote_prefill_threshold` uncached prompt tokens, gets blocks for its whole prompt
plus the first decode step (all or nothing, not published in the prefix cache yet) and waits
in `remote` for the prefill node to push its KV. Its destination blocks are never freed while
a write may still land: whatever ends the wait (abort, failure) moves them under a hold that
the node releases once the prefill node confirms, or its deadline passes.

With KV tiers under the pool (`tandem.engine.core.kv_tiers`), a waiting request whose prefix
continues in a lower tier steps aside into `loading` while its blocks are copied up, and
comes back to the head of the queue when they landed; each step's published blocks are
copied down after it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from tandem.engine.core.config import SchedulerConfig
from tandem.engine.core.kv_cache_manager import ComputedBlocks, KVCacheManager
from tandem.engine.core.request import Request, RequestStatus, TokenLogprobs
from tandem.engine.core.step_event import StepEvent
from tandem.engine.core.step_plan import StepPlan
from tandem.engine.core.step_planner import StepPlanner


@dataclass
class SchedulerOutput:
    """One step's plan: which requests run, and how many of their tokens each computes.

    Two views of the same step. `plan` is what the model runner receives: plain data, each
    request sent in full once and then as diffs (`StepPlan`). The rest is the engine's side
    and refers to the live requests, shared with the engine, never copied and never passed
    to the runner: `scheduled[i]` computes `all_token_ids[num_computed_tokens :
    + num_scheduled_tokens[i]]`, and is `plan.req_ids[i]`.

    Why handles here rather than ids looked up in `Scheduler.requests`: the engine side reads
    the step's requests after `update_from_output`, which has already removed the finished
    ones from the scheduler (stop strings, streaming each new token, a prefill node's last
    writes); handles stay valid, and the runner's signature (`execute(plan)`) is what keeps
    them out of the runner.
    """

    scheduled: list[Request] = field(default_factory=list)
    num_scheduled_tokens: list[int] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    # Admitted for remote prefill in this step: the node must now ask their prefill worker.
    remote_prefills: list[Request] = field(default_factory=list)
    # Requests admitted to be prefilled here, on their first admission: none named a prefill
    # worker (the router had none to offer) or their uncached part was short. With
    # `remote_prefills`, every request is one decision or the other (a retry after a failed
    # remote prefill is a fallback, not a decision).
    num_local_decisions: int = 0
    # What the runner receives, written by `Scheduler.schedule` (`add` leaves it as it is).
    plan: StepPlan = field(default_factory=StepPlan)

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    def add(self, request: Request, num_tokens: int) -> None:
        self.scheduled.append(request)
        self.num_scheduled_tokens.append(num_tokens)


@dataclass
class ModelRunnerOutput:
    """Per scheduled request, in batch order: the sampled token (None for a prefill chunk that
    did not reach the end of the sequence) and its log-probabilities when asked for.
    `kv_written`: the step's KV writes have landed once it is waited on (a step that samples
    nothing never synchronizes the device by itself)."""

    sampled_token_ids: list[int | None]
    logprobs: list[TokenLogprobs | None]
    kv_written: StepEvent = field(default_factory=StepEvent)


@dataclass(frozen=True)
class RemoteHold:
    """Destination blocks of an abandoned remote prefill, held until the prefill worker
    confirms the abort (or a deadline): a late write must not land in a reused block."""

    request_id: str
    attempt: int
    worker: str

    @property
    def key(self) -> str:
        return remote_hold_key(self.request_id, self.attempt)


def remote_hold_key(request_id: str, attempt: int) -> str:
    return f"{request_id}@{attempt}"


def prefill_job_key(agent: str, request_id: str, attempt: int) -> str:
    """A prefill worker's name for a decode node's attempt (`agent`: that node's agent name).
    `remote_hold_key` alone does not tell decode nodes apart: the router retries a failed
    request on another decode node under the same request id, which numbers its attempts
    from 1 again."""
    return f"{remote_hold_key(request_id, attempt)} for {agent}"


class Scheduler:
    """Owns the waiting queue, the running list, the requests waiting for remote KV, and the
    record of what the model runner holds (`planner`); mutates requests' status and
    counters."""

    def __init__(
        self,
        config: SchedulerConfig,
        kv_cache_manager: KVCacheManager,
        remote_prefill_threshold: int = 0,
    ) -> None:
        self.config = config
        self.kv = kv_cache_manager
        self.remote_prefill_threshold = remote_prefill_threshold
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.remote: dict[str, Request] = {}
        self.loading: dict[str, Request] = {}  # prefixes being loaded from a lower KV tier
        self._status_before_load: dict[str, RequestStatus] = {}  # restored when loaded
        self.requests: dict[str, Request] = {}
        self.num_preemptions = 0
        # Holds taken since the node last drained this list.
        self.abandoned_remote: list[RemoteHold] = []
        self.planner = StepPlanner(kv_cache_manager)

    @property
    def num_unfinished(self) -> int:
        return len(self.requests)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def add_request(self, request: Request) -> None:
        """Queue a validated request. Raises ValueError for a duplicate id."""
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def schedule(self) -> SchedulerOutput:
        """Plan one step. Mutates the queues, the requests' status and the block tables;
        `num_computed_tokens` advances only in `update_from_output`. The output's `plan`
        assumes the runner runs it before the next `schedule` whenever it is not empty."""
        out = SchedulerOutput()
        self._poll_tiers()
        budget = self._schedule_running(self.config.max_num_batched_tokens, out)
        if not out.preempted:
            self._schedule_waiting(budget, out)
        out.plan = self.planner.plan(out.scheduled, out.num_scheduled_tokens)
        return out

    def _schedule_running(self, budget: int, out: SchedulerOutput) -> int:
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            while self.kv.allocate_slots(request, num_new) is None:
                victim = self.running.pop()
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is request:
                    return budget
            out.add(request, num_new)
            budget -= num_new
            i += 1
        return budget

    def _schedule_waiting(self, budget: int, out: SchedulerOutput) -> None:
        max_seqs = self.config.max_num_seqs
        while self.waiting and budget > 0 and self._num_admitted < max_seqs:
            request = self.waiting[0]
            computed = ComputedBlocks()
            if request.num_computed_tokens == 0:
                computed = self.kv.get_computed_blocks(request, lower=not request.tier_loaded)
            if computed.lower:
                if not self._start_load(request, computed):
                    break
                continue
            num_new = request.num_tokens - request.num_computed_tokens - computed.num_tokens
            if request.prefill_worker is not None:
                if num_new >= self.remote_prefill_threshold:
                    if not self._admit_remote(request, computed, out):
                        break
                    continue
                request.prefill_worker = None
            num_new = min(num_new, budget)
            if self.kv.allocate_slots(request, num_new, computed) is None:
                break
            self.waiting.popleft()
            if request.status == RequestStatus.WAITING:  # its first admission
                out.num_local_decisions += 1
            self._admit(request, computed)
            out.add(request, num_new)
            budget -= num_new

    @property
    def _num_admitted(self) -> int:
        return len(self.running) + len(self.remote) + len(self.loading)

    def _start_load(self, request: Request, computed: ComputedBlocks) -> bool:
        """Step `request` aside while `computed.lower` is copied up into fresh blocks (its
        device hits kept meanwhile); False if the pool cannot spare the blocks now."""
        num_reclaimed = sum(1 for b in computed.blocks if b.ref_cnt == 0)
        if len(computed.lower) + num_reclaimed > self.kv.pool.num_free_blocks:
            return False
        self.waiting.popleft()
        self._count_prefix_hit(request, computed)
        request.tier_loaded = True
        self._status_before_load[request.request_id] = request.status
        request.status = RequestStatus.WAITING_FOR_KV_LOAD
        self.loading[request.request_id] = request
        self.kv.tiers.load(request.request_id, computed.lower, computed.blocks)
        return True

    def _poll_tiers(self) -> None:
        """Apply the finished tier copies: loaded requests go back to the head of the queue
        (in arrival order), where admission finds their blocks in the device cache."""
        if self.kv.tiers is None:
            return
        loaded = [self.loading.pop(rid) for rid in self.kv.tiers.poll() if rid in self.loading]
        for request in sorted(loaded, key=lambda r: r.arrival_time, reverse=True):
            request.status = self._status_before_load.pop(request.request_id)
            self.waiting.appendleft(request)

    def _admit_remote(
        self, request: Request, computed: ComputedBlocks, out: SchedulerOutput
    ) -> bool:
        """Reserve the whole prompt plus the first decode step; False if it does not fit."""
        num_new = request.num_tokens + 1 - computed.num_tokens
        if self.kv.allocate_slots(request, num_new, computed, publish=False) is None:
            return False
        self.waiting.popleft()
        self._count_prefix_hit(request, computed)
        request.num_computed_tokens = computed.num_tokens
        request.num_remote_skip_blocks = computed.num_tokens // self.kv.block_size
        request.num_remote_attempts += 1
        request.status = RequestStatus.WAITING_FOR_REMOTE_KV
        self.remote[request.request_id] = request
        out.remote_prefills.append(request)
        return True

    def remote_destination(self, request: Request) -> list[int]:
        """Block ids the prefill worker writes: the prompt's blocks it computes for us."""
        num_prompt_blocks = self.kv.num_blocks_needed(request.num_tokens)
        table = self.kv.block_ids(request.request_id)
        return table[request.num_remote_skip_blocks : num_prompt_blocks]

    def complete_remote_prefill(
        self, request_id: str, token_id: int, logprobs: TokenLogprobs | None
    ) -> Request | None:
        """The prompt's KV has landed and the prefill worker sampled `token_id`: publish the
        blocks and join the decode batch. Returns the request if that token finished it."""
        request = self.remote.pop(request_id)
        request.num_computed_tokens = request.num_tokens
        self.kv.cache_blocks(request, request.num_computed_tokens)
        request.prefill_worker = None
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        request.append_output_token(token_id, logprobs)
        status = request.check_stop(self.config.max_model_len)
        if status is None:
            return None
        self._finish(request, status)
        return request

    def retry_remote(self, request_id: str, worker: str | None) -> None:
        """A remote prefill failed: hold its destination blocks, free the rest, and queue
        the request first in line, for `worker` (None: prefill here)."""
        request = self.remote.pop(request_id)
        self._abandon_remote(request)
        self.kv.free(request)
        request.num_computed_tokens = 0
        request.prefill_worker = worker
        request.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(request)

    def _abandon_remote(self, request: Request) -> None:
        hold = RemoteHold(request.request_id, request.num_remote_attempts, request.prefill_worker)
        self.kv.hold(hold.key, request.request_id, request.num_remote_skip_blocks)
        self.abandoned_remote.append(hold)

    def _count_prefix_hit(self, request: Request, computed: ComputedBlocks) -> None:
        """On a request's first admission (not after preemption, a failed remote try or a
        load from a lower tier): device hits and those it loads from lower tiers."""
        if request.status == RequestStatus.WAITING and not request.tier_loaded:
            lower = len(computed.lower) * self.kv.block_size
            request.num_cached_tokens = computed.num_tokens + lower
            stats = self.kv.stats
            stats.queries += request.num_tokens
            stats.hits += computed.num_tokens + lower
            stats.tier_hits["device"] += computed.num_tokens
            for hit in computed.lower:
                stats.tier_hits[hit.tier] += self.kv.block_size

    def _admit(self, request: Request, computed: ComputedBlocks) -> None:
        self._count_prefix_hit(request, computed)
        request.num_computed_tokens += computed.num_tokens
        request.status = RequestStatus.RUNNING
        self.running.append(request)

    def _preempt(self, request: Request) -> None:
        self.kv.free(request)
        self.planner.drop(request.request_id, preempted=True)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def update_from_output(self, out: SchedulerOutput, result: ModelRunnerOutput) -> list[Request]:
        """Advance computed counters, append sampled tokens, finish requests that stop.

        Returns the requests that finished in this step (their blocks already freed).
        """
        finished: list[Request] = []
        for request, num_tokens, token_id, logprobs in zip(
            out.scheduled, out.num_scheduled_tokens, result.sampled_token_ids, result.logprobs
        ):
            request.num_computed_tokens += num_tokens
            if token_id is None:
                continue
            request.append_output_token(token_id, logprobs)
            status = request.check_stop(self.config.max_model_len)
            if status is not None:
                self._finish(request, status)
                finished.append(request)
        if self.kv.tiers is not None:
            self.kv.tiers.store_published()  # the step computed them: copy them down
        return finished

    def finish_requests(self, request_ids: Iterable[str], status: RequestStatus) -> list[Request]:
        """Finish (e.g. abort) requests wherever they are; unknown ids are ignored.

        Returns the requests that were finished here.
        """
        finished = []
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is not None:
                self._finish(request, status)
                finished.append(request)
        return finished

    def _finish(self, request: Request, status: RequestStatus) -> None:
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        elif request.status == RequestStatus.WAITING_FOR_REMOTE_KV:
            del self.remote[request.request_id]
            self._abandon_remote(request)
        elif request.status == RequestStatus.WAITING_FOR_KV_LOAD:
            del self.loading[request.request_id]  # the tiers keep the blocks the copy writes
            del self._status_before_load[request.request_id]
        else:
            self.waiting.remove(request)
        self.kv.free(request)
        self.planner.drop(request.request_id)
        request.status = status
        del self.requests[request.request_id]
