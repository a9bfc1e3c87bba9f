"""Per-request sampling parameters, validated when built."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from tandem.engine.structured.spec import StructuredOutputsParams

_GREEDY_EPS = 1e-5
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
MAX_N = 16  # choices per request
MAX_LOGPROBS = 20  # top alternatives per token (vLLM's default `max_logprobs`)


class InvalidSamplingParam(ValueError):
    """A sampling parameter outside its rules; `param` names the field (the router's API
    error names it too)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Range:
    """The values a numeric field may take: from `low` (excluded if `low_open`) to `high`,
    None for no end. A NaN is in no range."""

    low: float
    high: float | None = None
    low_open: bool = False

    def __contains__(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        return above and (self.high is None or value <= self.high)

    def __str__(self) -> str:
        if self.low == _INT64_MIN and self.high == _INT64_MAX:
            return "an int64"
        if self.high is None or self.high == _INT64_MAX:
            end = f"greater than {self.low}" if self.low_open else f"at least {self.low}"
            return end if self.high is None else f"{end} and fit in int64"
        return f"in {'(' if self.low_open else '['}{self.low}, {self.high}]"


# Every numeric field's rule, the one place they are kept: the engine checks them when a
# SamplingParams is built (on the nodes too, as the wire decodes one), and the router's API
# errors are these. The integers travel as msgpack int64 and seed torch generators.
RANGES: Mapping[str, Range] = MappingProxyType(
    {
        "n": Range(1, _INT64_MAX),
        "temperature": Range(0),
        "top_p": Range(0, 1, low_open=True),
        "top_k": Range(-1, _INT64_MAX),  # -1 and 0: no filter
        "min_p": Range(0, 1),
        "seed": Range(_INT64_MIN, _INT64_MAX),
        "presence_penalty": Range(-2, 2),
        "frequency_penalty": Range(-2, 2),
        "repetition_penalty": Range(0, low_open=True),
        "max_tokens": Range(1, _INT64_MAX),
        "min_tokens": Range(0, _INT64_MAX),
        "logprobs": Range(0, _INT64_MAX),
    }
)
# What the OpenAI-compatible API accepts: the same table, narrowed where the API is
# narrower than the engine (OpenAI's bounds where its API has the field, vLLM's default
# `max_logprobs`, and the router's own cap on choices). The offline engine keeps the wider
# ranges, as vLLM's does.
API_RANGES: Mapping[str, Range] = MappingProxyType(
    {
        **RANGES,
        "n": Range(1, MAX_N),
        "temperature": Range(0, 2),
        "logprobs": Range(0, MAX_LOGPROBS),
    }
)
API_LOGIT_BIAS = Range(-100, 100)


@dataclass
class SamplingParams:
    """How to pick tokens and when to stop, with vLLM's names and meanings.

    `temperature == 0` is greedy. `top_k <= 0` and `top_p == 1` disable those filters.
    `seed` makes a request's random draws independent of the batch around it.
    `logprobs=N` returns the sampled token's log-probability plus the top N (0: only
    the sampled one); `None` returns none. `structured_outputs` constrains the output to
    a JSON schema, a regex, a choice or a grammar (vLLM's `StructuredOutputsParams`; a
    dict of its fields is accepted, as it travels between nodes). Raises
    InvalidSamplingParam (a ValueError naming the field) for a value outside `RANGES` or
    the rules between fields.
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
            self.logit_bias = _token_biases(self.logit_bias)
        self.structured_outputs = StructuredOutputsParams.coerce(self.structured_outputs)
        self._validate()

    def check_api_limits(self) -> None:
        """InvalidSamplingParam unless the parameters are also within what the API accepts
        (`API_RANGES`, `API_LOGIT_BIAS`): the router calls it, the offline engine does not."""
        self._check_ranges(API_RANGES)
        for bias in (self.logit_bias or {}).values():
            if bias not in API_LOGIT_BIAS:
                raise InvalidSamplingParam(
                    "logit_bias", f"logit_bias values must be {API_LOGIT_BIAS}, got {bias}"
                )

    def _check_ranges(self, ranges: Mapping[str, Range]) -> None:
        for name, allowed in ranges.items():
            value = getattr(self, name)
            if value is not None and value not in allowed:
                raise InvalidSamplingParam(name, f"{name} must be {allowed}, got {value}")

    def _validate(self) -> None:
        self._check_ranges(RANGES)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise InvalidSamplingParam(
                "min_tokens",
                f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})",
            )
        if not all(self.stop):
            raise InvalidSamplingParam("stop", "stop strings must not be empty")

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


def _token_biases(bias: dict) -> dict[int, float]:
    try:
        return {int(k): float(v) for k, v in bias.items()}
    except ValueError as exc:
        raise InvalidSamplingParam("logit_bias", "logit_bias keys must be token ids") from exc
