"""Per-request state: plain counters, with derived values as properties."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tandem.engine.core.block_hash import BlockHash
from tandem.engine.core.sampling_params import SamplingParams

if TYPE_CHECKING:
    from tandem.engine.structured.grammar import Grammar


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH = 4
    FINISHED_ABORTED = 5
    # Blocks reserved, prompt KV being pushed by a prefill node (disaggregated decode).
    WAITING_FOR_REMOTE_KV = 6
    # Failed for a reason other than the client (e.g. remote prefill failed, policy "fail").
    FINISHED_ERROR = 7
    # Stepped aside while its prefix is copied up from a lower KV tier (no blocks of its own).
    WAITING_FOR_KV_LOAD = 8

    @property
    def is_finished(self) -> bool:
        return self in _FINISH_REASONS

    @property
    def finish_reason(self) -> str | None:
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


@dataclass(frozen=True)
class TokenLogprobs:
    """Log-probabilities for one sampled token: its own, its rank, and the top N."""

    token_id: int
    logprob: float
    rank: int
    top: tuple[tuple[int, float], ...]


class Request:
    """One sequence being generated. The scheduler owns its status and counters; the KV-cache
    manager owns its blocks and `block_hashes`; its `grammar` (structured outputs) is advanced
    by every appended token. The model runner never sees it: it keeps a copy of its own, sent
    in the step's plan (`tandem.engine.core.step_plan`).

    The model computes `all_token_ids[:num_computed_tokens]`; a request is decoding when
    only its last sampled token is left to compute.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        eos_token_ids: tuple[int, ...] = (),
        cache_salt: str | None = None,
        arrival_time: float | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.eos_token_ids = eos_token_ids
        self.cache_salt = cache_salt
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.all_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.output_logprobs: list[TokenLogprobs] = []
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0
        self.num_preemptions = 0
        self.status = RequestStatus.WAITING
        self.block_hashes: list[BlockHash] = []
        # Seeds the runner's generator for this request's draws (None: the global one).
        self.seed: int | None = None
        # Structured outputs: the matcher of the tokens output so far (None: unconstrained).
        # A preempted request keeps it: its output tokens are recomputed, not resampled.
        self.grammar: Grammar | None = None
        # The stop token id or stop string that finished the request, if one did.
        self.stop_reason: int | str | None = None
        # Disaggregation: the prefill worker to ask (None: prefill here), and how many of
        # the request's leading blocks were already cached when it was sent there.
        self.prefill_worker: str | None = None
        self.num_remote_skip_blocks = 0
        self.num_remote_attempts = 0
        # KV tiers: its prefix was loaded from a lower tier once (never twice).
        self.tier_loaded = False

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def ends_on_stop_token(self) -> bool:
        """The last token is the stop token that finished the request, and is not text."""
        return (
            isinstance(self.stop_reason, int)
            and not self.sampling_params.include_stop_str_in_output
        )

    def append_output_token(self, token_id: int, logprobs: TokenLogprobs | None = None) -> None:
        """Append a sampled token (here, or by a prefill node) and advance the grammar."""
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
        if logprobs is not None:
            self.output_logprobs.append(logprobs)
        if self.grammar is not None:
            self.grammar.accept(token_id)

    def check_stop(self, max_model_len: int) -> RequestStatus | None:
        """The finished status the last appended token implies, or None to go on. Records
        the stop token in `stop_reason`. A grammar that is complete stops the request (no
        token could follow); one the token broke (only a token the mask did not come from,
        say a prefill node's with another grammar) fails it."""
        params = self.sampling_params
        num_out = self.num_output_tokens
        last = self.output_token_ids[-1]
        if num_out >= params.min_tokens and (
            last in params.stop_token_ids or (not params.ignore_eos and last in self.eos_token_ids)
        ):
            self.stop_reason = last
            return RequestStatus.FINISHED_STOPPED
        if self.grammar is not None and self.grammar.is_terminated:
            if self.grammar.is_error:
                return RequestStatus.FINISHED_ERROR
            return RequestStatus.FINISHED_STOPPED
        if params.max_tokens is not None and num_out >= params.max_tokens:
            return RequestStatus.FINISHED_LENGTH
        if self.num_tokens >= max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, status={self.status.name})"
        )
