"""The model runner's own copy of each request it runs (vLLM V1's `CachedRequestState`):
made from a plan's `NewRequestData`, updated by its diffs, dropped when a plan says so. The
runner builds each step's arrays from these copies, and the sampler reads them."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tandem.engine.core.sampling_params import SamplingParams
from tandem.engine.core.step_plan import NewRequestData, StepPlan


@dataclass(eq=False, slots=True)
class RequestState:
    """One request as the runner knows it. `all_token_ids` ends with the token the runner
    last sampled for it; `generator` is advanced by each of its draws."""

    request_id: str
    all_token_ids: list[int]  # the prompt, then the output tokens
    output_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: tuple[int, ...]
    generator: torch.Generator | None
    block_ids: list[int]  # the block table
    num_computed_tokens: int  # as of the last plan
    # Read by the sampler every step, derived from `sampling_params` once.
    greedy: bool = field(init=False)
    needs_edits: bool = field(init=False)  # logit bias or penalties, at every step

    def __post_init__(self) -> None:
        params = self.sampling_params
        self.greedy = params.greedy
        self.needs_edits = bool(params.logit_bias or params.needs_penalties)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def has_grammar(self) -> bool:
        """Its next tokens are masked by a grammar (structured outputs)."""
        return self.sampling_params.structured_outputs is not None

    def append_token(self, token_id: int) -> None:
        self.all_token_ids.append(token_id)
        self.output_token_ids.append(token_id)


class RequestStates:
    """The runner's table of `RequestState` by request id. Owns the generators, made on
    `device` with draws `vocab_size` wide (the sampler's)."""

    def __init__(self, device: torch.device, vocab_size: int) -> None:
        self.device = device
        self.vocab_size = vocab_size
        self._states: dict[str, RequestState] = {}

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._states

    def __getitem__(self, request_id: str) -> RequestState:
        return self._states[request_id]

    def update(self, plan: StepPlan) -> list[RequestState]:
        """Apply `plan`: drop, add, then apply the diffs. Returns the batch's states in batch
        order. Raises KeyError for a diff or a batch row of a request it does not hold."""
        for request_id in plan.finished_req_ids:
            self._states.pop(request_id, None)
        for request_id in plan.preempted_req_ids:
            self._states.pop(request_id, None)
        for data in plan.new_reqs:
            assert data.request_id not in self._states, data.request_id
            self._states[data.request_id] = self._create(data)
        states, cached = self._states, plan.cached_reqs
        for request_id, num_computed in zip(cached.req_ids, cached.num_computed_tokens):
            states[request_id].num_computed_tokens = num_computed
        for request_id, block_ids in cached.new_block_ids.items():
            states[request_id].block_ids.extend(block_ids)
        for request_id, token_ids in cached.new_token_ids.items():
            for token_id in token_ids:
                states[request_id].append_token(token_id)
        return [states[request_id] for request_id in plan.req_ids]

    def _create(self, data: NewRequestData) -> RequestState:
        output = data.token_ids[data.num_prompt_tokens :]
        generator = self._generator(data.sampling_params, data.seed, len(output))
        return RequestState(
            request_id=data.request_id,
            all_token_ids=list(data.token_ids),
            output_token_ids=output,
            sampling_params=data.sampling_params,
            eos_token_ids=data.eos_token_ids,
            generator=generator,
            block_ids=list(data.block_ids),
            num_computed_tokens=data.num_computed_tokens,
        )

    def _generator(
        self, params: SamplingParams, seed: int | None, num_drawn: int
    ) -> torch.Generator | None:
        """A generator where the request's would be after `num_drawn` sampled tokens (drawn
        by a prefill node, or here before a preemption): each draw is one exponential per
        vocabulary entry (`sampler._sample`)."""
        if seed is None or params.greedy:
            return None
        generator = torch.Generator(self.device).manual_seed(seed)
        if num_drawn:
            race = torch.empty(self.vocab_size, device=self.device)  # [V]
            for _ in range(num_drawn):
                race.exponential_(generator=generator)
        return generator
