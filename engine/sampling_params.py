"""Per-request sampling parameters, validated when built."""

from __future__ import annotations

from dataclasses import dataclass, field

from tandem.engine.structured_outputs import StructuredOutputsParams

_GREEDY_EPS = 1e-5
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


@dataclass
class SamplingParams:
    """How to pick tokens and when to stop, with vLLM's names and meanings.

    `temperature == 0` is greedy. `top_k <= 0` and `top_p == 1` disable those filters.
    `seed` makes a request's random draws independent of the batch around it.
    `logprobs=N` returns the sampled token's log-probability plus the top N (0: only
    the sampled one); `None` returns none. `structured_outputs` constrains the output to
    a JSON schema, a regex, a choice or a grammar (vLLM's `StructuredOutputsParams`; a
    dict of its fields is accepted, as it travels between nodes). Raises ValueError for an
    invalid field.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    stop: list[str] | str | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    skip_special_tokens: bool = True
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.logit_bias and not isinstance(self.logit_bias, dict):
            raise TypeError("logit_bias must be an object of token id to bias")  # not a 500
        if self.logit_bias:  # JSON object keys arrive as strings
            self.logit_bias = {int(k): float(v) for k, v in self.logit_bias.items()}
        self.structured_outputs = StructuredOutputsParams.coerce(self.structured_outputs)
        self._validate()

    def _validate(self) -> None:
        checks = [
            (self.n >= 1, f"n must be at least 1, got {self.n}"),
            (self.temperature >= 0, f"temperature must be non-negative, got {self.temperature}"),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"),
            (self.top_k >= -1, f"top_k must be -1, 0 (disabled) or positive, got {self.top_k}"),
            (0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p}"),
            (
                -2 <= self.presence_penalty <= 2,
                f"presence_penalty must be in [-2, 2], got {self.presence_penalty}",
            ),
            (
                -2 <= self.frequency_penalty <= 2,
                f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}",
            ),
            (
                self.repetition_penalty > 0,
                f"repetition_penalty must be positive, got {self.repetition_penalty}",
            ),
            (
                self.max_tokens is None or self.max_tokens >= 1,
                f"max_tokens must be at least 1, got {self.max_tokens}",
            ),
            (self.min_tokens >= 0, f"min_tokens must be non-negative, got {self.min_tokens}"),
            (
                self.max_tokens is None or self.min_tokens <= self.max_tokens,
                f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})",
            ),
            (
                self.logprobs is None or self.logprobs >= 0,
                f"logprobs must be non-negative, got {self.logprobs}",
            ),
            (all(s for s in self.stop), "stop strings must not be empty"),
        ]
        for name in ("n", "seed", "top_k", "max_tokens", "min_tokens", "logprobs"):
            value = getattr(self, name)
            # these travel as msgpack/int64 and seed torch generators
            checks.append(
                (value is None or _INT64_MIN <= value <= _INT64_MAX, f"{name} is out of range")
            )
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS

    @property
    def needs_penalties(self) -> bool:
        return bool(
            self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
        )

    @property
    def needs_filters(self) -> bool:
        return self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0
