"""The scheduler's record of what the model runner holds of each request, and each step's
`StepPlan` written as the difference from it (see `tandem.engine.core.step_plan`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tandem.engine.core.kv_cache_manager import KVCacheManager
from tandem.engine.core.request import Request
from tandem.engine.core.step_plan import GrammarBitmask, NewRequestData, StepPlan
from tandem.engine.structured.bitmask import BitmaskFiller


@dataclass(slots=True)
class _Held:
    """What the runner has of one request once the step it was last planned in has run."""

    num_blocks: int  # the leading block ids of its table
    num_tokens: int  # the leading token ids (it appends the token it samples)


class StepPlanner:
    """Owned by the scheduler, which calls `drop` wherever a request leaves the running set
    (finish, abort, preemption). `plan` reads the scheduled requests and their block tables,
    and mutates only this record."""

    def __init__(self, kv_cache_manager: KVCacheManager) -> None:
        self.kv = kv_cache_manager
        self._held: dict[str, _Held] = {}
        # Preempted, not resumed yet: the runner keeps their generators until told.
        self._parked: set[str] = set()
        self._finished: list[str] = []
        self._preempted: list[str] = []
        self._bitmasks = BitmaskFiller()

    @property
    def num_held(self) -> int:
        """Requests the runner holds once every plan so far has run (not counting the
        preempted ones whose generators it keeps)."""
        return len(self._held)

    def drop(self, request_id: str, preempted: bool = False) -> None:
        """The runner must forget `request_id`, all but its generator if `preempted` (it is
        told by the next plan that runs a batch). A request it holds nothing of is ignored."""
        if self._held.pop(request_id, None) is not None:
            (self._preempted if preempted else self._finished).append(request_id)
            if preempted:
                self._parked.add(request_id)
        elif not preempted and request_id in self._parked:
            self._parked.remove(request_id)
            if request_id in self._preempted:  # not told yet (no batch since): drop once
                self._preempted.remove(request_id)
            self._finished.append(request_id)

    def plan(self, scheduled: Sequence[Request], num_scheduled_tokens: Sequence[int]) -> StepPlan:
        """The plan for `scheduled[b]` computing `num_scheduled_tokens[b]` tokens. With
        nothing scheduled the plan is empty and the drops wait: no caller runs an empty
        step."""
        if not scheduled:
            return StepPlan()
        plan = StepPlan(
            req_ids=[r.request_id for r in scheduled],
            num_scheduled_tokens=list(num_scheduled_tokens),
            finished_req_ids=self._finished,
            preempted_req_ids=self._preempted,
        )
        self._finished, self._preempted = [], []
        constrained: list[Request] = []
        for request, n in zip(scheduled, num_scheduled_tokens):
            if self._add(plan, request, n) and request.grammar is not None:
                constrained.append(request)
        if constrained:
            bits = self._bitmasks.fill([r.grammar for r in constrained])
            plan.grammar_bitmask = GrammarBitmask([r.request_id for r in constrained], bits)
        return plan

    def _add(self, plan: StepPlan, request: Request, num_new: int) -> bool:
        """Put `request` in `plan`, in full or as its diff; True if it samples this step."""
        request_id, token_ids = request.request_id, request.all_token_ids
        samples = request.num_computed_tokens + num_new == len(token_ids)
        table = self.kv.block_ids(request_id)
        held = self._held.get(request_id)
        if held is None:
            self._parked.discard(request_id)
            plan.new_reqs.append(_new_request_data(request, table))
            self._held[request_id] = _Held(len(table), len(token_ids) + samples)
            return samples
        cached = plan.cached_reqs
        cached.req_ids.append(request_id)
        cached.num_computed_tokens.append(request.num_computed_tokens)
        if len(table) > held.num_blocks:
            cached.new_block_ids[request_id] = table[held.num_blocks :]
            held.num_blocks = len(table)
        if len(token_ids) > held.num_tokens:
            cached.new_token_ids[request_id] = token_ids[held.num_tokens :]
        held.num_tokens = len(token_ids) + samples
        return samples


def _new_request_data(request: Request, table: list[int]) -> NewRequestData:
    return NewRequestData(
        request_id=request.request_id,
        token_ids=list(request.all_token_ids),
        num_prompt_tokens=request.num_prompt_tokens,
        sampling_params=request.sampling_params,
        eos_token_ids=tuple(request.eos_token_ids),
        seed=request.seed,
        block_ids=list(table),
        num_computed_tokens=request.num_computed_tokens,
    )
