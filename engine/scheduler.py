"""The scheduler: computed tokens catch up with each request's tokens, under a token budget.

There is no prefill phase and no decode phase. Each step, running requests take their next
tokens first (one for a decoding request, a chunk for a partly prefilled one), then waiting
requests are admitted in arrival order with what is left of the budget. When the pool runs
out of blocks, the newest running request is preempted: its blocks are freed and it is
recomputed later (prompt plus the tokens it already produced).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from tandem.engine.config import SchedulerConfig
from tandem.engine.kv_cache_manager import ComputedBlocks, KVCacheManager
from tandem.engine.request import Request, RequestStatus, TokenLogprobs


@dataclass
class SchedulerOutput:
    """One step's plan: which requests run, and how many of their tokens each computes.

    `scheduled[i]` computes `all_token_ids[num_computed_tokens : + num_scheduled_tokens[i]]`;
    the request objects are shared with the engine, not copied.
    """

    scheduled: list[Request] = field(default_factory=list)
    num_scheduled_tokens: list[int] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

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
    did not reach the end of the sequence) and its log-probabilities when asked for."""

    sampled_token_ids: list[int | None]
    logprobs: list[TokenLogprobs | None]


class Scheduler:
    """Owns the waiting queue and the running list; mutates requests' status and counters."""

    def __init__(self, config: SchedulerConfig, kv_cache_manager: KVCacheManager) -> None:
        self.config = config
        self.kv = kv_cache_manager
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.num_preemptions = 0

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
        `num_computed_tokens` advances only in `update_from_output`."""
        out = SchedulerOutput()
        budget = self._schedule_running(self.config.max_num_batched_tokens, out)
        if not out.preempted:
            self._schedule_waiting(budget, out)
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
        while self.waiting and budget > 0 and len(self.running) < max_seqs:
            request = self.waiting[0]
            computed = ComputedBlocks()
            if request.num_computed_tokens == 0:
                computed = self.kv.get_computed_blocks(request)
            num_new = request.num_tokens - request.num_computed_tokens - computed.num_tokens
            num_new = min(num_new, budget)
            if self.kv.allocate_slots(request, num_new, computed) is None:
                break
            self.waiting.popleft()
            self._admit(request, computed)
            out.add(request, num_new)
            budget -= num_new

    def _admit(self, request: Request, computed: ComputedBlocks) -> None:
        if request.status == RequestStatus.WAITING:
            request.num_cached_tokens = computed.num_tokens
            self.kv.stats.queries += request.num_tokens
            self.kv.stats.hits += computed.num_tokens
        request.num_computed_tokens += computed.num_tokens
        request.status = RequestStatus.RUNNING
        self.running.append(request)

    def _preempt(self, request: Request) -> None:
        self.kv.free(request)
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
        else:
            self.waiting.remove(request)
        self.kv.free(request)
        request.status = status
        del self.requests[request.request_id]
