"""What crosses from the scheduler into the model runner each step: plain data, no `Request`.

The runner keeps its own copy of every request it has run (`tandem.engine.exec.request_state`),
so a step's plan sends each request in full once and then only what changed, as vLLM V1's
`SchedulerOutput` does (`NewRequestData`, `CachedRequestData`):

- a request scheduled for the first time, or again after preemption, comes in `new_reqs` with
  its token ids so far, sampling params, seed, block ids and computed count;
- a request the runner already holds comes in `cached_reqs` with only the block ids appended
  to its table since its last step, its computed count, and any token appended to it outside
  the runner's own sampling (none today: a decode node's first token from a prefill node is
  appended before the request is ever scheduled there);
- `finished_req_ids` and `preempted_req_ids` name the requests whose state the runner drops
  (finished, aborted or preempted since the last plan that ran a batch); of a preempted one
  it keeps only the generator, until the request resumes (sent in full again) or finishes.

Leaves are str, int, float, bool, None, lists and tuples of them, `SamplingParams` (itself
plain data) and numpy arrays; a plan can be pickled as it is.

Structured outputs. The grammar matchers stay with their requests on the scheduler's side,
where `update_from_output` advances them: the plan carries, for each sequence that samples
this step under a grammar, its allowed tokens as a plain bitmask filled before the step
(`GrammarBitmask`, vLLM's `grammar_bitmask`). The runner only turns the bits into -inf on the
logits. The alternative, sending matcher handles, would put a live object in the plan.

Sampling draws. The runner makes each request's `torch.Generator` from the seed in its
`NewRequestData`, then skips one draw per output token it did not sample itself (a token a
prefill node sampled): a request's draws are a function of its seed and its output count.
A resumed request could be rebuilt the same way, but replaying its draws costs about 3 ms a
token on the CPU (a 152k vocabulary), so the runner parks a preempted request's generator
instead (`tandem.engine.exec.request_state`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tandem.engine.core.sampling_params import SamplingParams


@dataclass(frozen=True)
class NewRequestData:
    """A request the runner does not hold: everything it needs to run and sample it."""

    request_id: str
    token_ids: list[int]  # the prompt, then the output tokens so far (a copy)
    num_prompt_tokens: int
    sampling_params: SamplingParams  # the request's own: read-only on both sides
    eos_token_ids: tuple[int, ...]
    seed: int | None  # of the request's draws; None: the global generator
    block_ids: list[int]  # the whole block table (a copy)
    num_computed_tokens: int


@dataclass
class CachedRequestData:
    """Requests the runner holds, and their diffs since their last step: `req_ids[i]` has
    `num_computed_tokens[i]`; only the requests whose table grew are in `new_block_ids`, and
    only those given tokens outside the runner's sampling in `new_token_ids` (the runner
    appends the tokens it samples itself)."""

    req_ids: list[str] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)
    new_block_ids: dict[str, list[int]] = field(default_factory=dict)  # appended to the table
    new_token_ids: dict[str, list[int]] = field(default_factory=dict)  # appended to the tokens

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)


@dataclass(frozen=True)
class GrammarBitmask:
    """The allowed next tokens of the sequences that sample under a grammar this step, in
    batch order: bit j of word w in row g allows token 32w + j for `request_ids[g]`. Rows are
    as wide as the grammars' vocabulary, which may exceed the logits (cut by the runner)."""

    request_ids: list[str]  # [G]
    bits: np.ndarray  # [G, W] int32


@dataclass
class StepPlan:
    """One step for the runner. Sequence b of the batch is `req_ids[b]`; it computes its
    tokens `num_computed_tokens : + num_scheduled_tokens[b]`, and samples when that reaches
    the end of its tokens. The runner applies, in order: drops, new requests, cached diffs."""

    req_ids: list[str] = field(default_factory=list)  # [B] batch order
    num_scheduled_tokens: list[int] = field(default_factory=list)  # [B]
    new_reqs: list[NewRequestData] = field(default_factory=list)
    cached_reqs: CachedRequestData = field(default_factory=CachedRequestData)
    finished_req_ids: list[str] = field(default_factory=list)  # finished or aborted
    preempted_req_ids: list[str] = field(default_factory=list)  # their generators kept
    grammar_bitmask: GrammarBitmask | None = None

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens)
