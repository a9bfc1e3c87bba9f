"""What the engine returns: one `RequestOutput` per request, one `CompletionOutput` per copy."""

from __future__ import annotations

from dataclasses import dataclass, field

from tandem.engine.core.request import TokenLogprobs


@dataclass
class CompletionOutput:
    """One generated sequence. `finish_reason` is "stop", "length" or "abort"; `stop_reason`
    is the stop string or stop token id that ended it, if any."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    stop_reason: int | str | None = None
    logprobs: list[TokenLogprobs] | None = None

    @property
    def cumulative_logprob(self) -> float | None:
        if self.logprobs is None:
            return None
        return sum(lp.logprob for lp in self.logprobs)


@dataclass
class RequestOutput:
    """A finished request: its prompt and its `n` completions, ordered by index."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = True
    num_cached_tokens: int = 0
