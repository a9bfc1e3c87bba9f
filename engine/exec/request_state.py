"""The model runner's own copy of each request it runs (vLLM V1's `CachedRequestState`):
made from a plan's `NewRequestData`, updated by its diffs, dropped when a plan says so. The
runner builds each step's arrays from these copies, and the sampler reads them.

A preempted request's copy is dropped but its generator is parked until the request resumes
or finishes: rebuilding it from the seed replays one draw per output token, and on the CPU a
draw over a 152k vocabulary costs about 3 ms (a request preempted after 1,000 tokens would
stall the engine for 3 s on resuming)."""

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
    `device`."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._states: dict[str, RequestState] = {}
        # Preempted requests' generators and the draws they have made.
        self._parked: dict[str, tuple[torch.Generator, int]] = {}

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._states

    def __getitem__(self, request_id: str) -> RequestState:
        return self._states[request_id]

    @property
    def num_parked(self) -> int:
        """Generators kept for preempted requests."""
        return len(self._parked)

    def update(self, plan: StepPlan) -> list[RequestState]:
        """Apply `plan`: drop, add, then apply the diffs. Returns the batch's states in batch
        order. Raises KeyError for a diff or a batch row of a request it does not hold."""
        for request_id in plan.finished_req_ids:
            self._states.pop(request_id, None)
            self._parked.pop(request_id, None)
        for request_id in plan.preempted_req_ids:
            state = self._states.pop(request_id)
            if state.generator is not None:
                self._parked[request_id] = (state.generator, state.num_output_tokens)
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
        generator = self._generator(data, len(output))
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

    def _generator(self, data: NewRequestData, num_drawn: int) -> torch.Generator | None:
        """A generator where the request's is after `num_drawn` sampled tokens: its parked
        one, or a new one from its seed, past the draws it has not made (a prefill node's
        first token). Each draw is `draw`, one uniform number."""
        parked = self._parked.pop(data.request_id, None)
        if data.seed is None or data.sampling_params.greedy:
            return None
        generator, num_made = parked or (torch.Generator(self.device).manual_seed(data.seed), 0)
        assert num_made <= num_drawn, (data.request_id, num_made, num_drawn)
        if num_drawn > num_made:
            u = torch.empty(1, device=self.device)  # [1]
            for _ in range(num_drawn - num_made):
                draw(u, generator)
        return generator


def draw(u: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One draw of a request's generator: `u` [1] float32 filled with a uniform number in
    place (the sampler's inverse CDF). Replaying draws must make the same calls."""
    return u.uniform_(generator=generator)
