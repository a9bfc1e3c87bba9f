"""A decode request as the decode node holds it: what the router sent (`GenerateInput`), the
stream of records back to it (`Stream`, its `Sink`) and the record format (`make_record`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tandem.engine.core.request import Request
from tandem.engine.core.sampling_params import SamplingParams
from tandem.engine.detokenizer import IncrementalDetokenizer

Sink = Callable[[dict[str, Any]], None]


@dataclass
class GenerateInput:
    """What the router sends: token ids, sampling parameters, and the prefill worker."""

    request_id: str
    token_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    prefill: str | None = None
    prefill_alternates: list[str] = field(default_factory=list)
    cache_salt: str | None = None
    log_id: str | None = None  # the client's request id (x-request-id), for log lines
    trace: dict[str, str] = field(default_factory=dict)  # W3C context of the router's span


@dataclass
class Stream:
    """One request's stream: its request, where records go, and its timings and spans."""

    request: Request
    sink: Sink
    detok: IncrementalDetokenizer
    sampling: SamplingParams  # with the effective seed, as sent to prefill workers
    arrival: float
    admitted: float | None = None
    last_token: float | None = None
    sent: float = 0.0  # when the current remote attempt was sent
    timings: dict[str, float] | None = None  # remote prefill breakdown, on the first record
    log_id: str | None = None
    span: Any = None  # the request's span, None when tracing is off
    remote_span: Any = None  # the current remote prefill attempt's


def make_record(stream: Stream, tokens: list[int], finished: bool = False) -> dict[str, Any]:
    """One ndjson record to the router: `tokens` and their text delta, and on the last one
    the finish reason, stop reason and usage."""
    request = stream.request
    out: dict[str, Any] = {
        "request_id": request.request_id,
        "token_ids": tokens,
        "text": stream.detok.take_delta(finished),
        "logprobs": None,
        "finish_reason": None,
    }
    if tokens and request.sampling_params.logprobs is not None and request.output_logprobs:
        lp = request.output_logprobs[-1]
        out["logprobs"] = [
            {
                "token_id": lp.token_id,
                "logprob": lp.logprob,
                "rank": lp.rank,
                "top": [[t, v] for t, v in lp.top],
            }
        ]
    if stream.timings is not None:
        out["timings"], stream.timings = stream.timings, None
    if finished:
        out["finish_reason"] = request.status.finish_reason or "abort"
        out["stop_reason"] = request.stop_reason
        out["usage"] = {
            "prompt_tokens": request.num_prompt_tokens,
            "completion_tokens": request.num_output_tokens,
            "cached_tokens": request.num_cached_tokens,
        }
    return out
