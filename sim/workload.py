"""Workloads: requests with arrival times, prompt token ids and output lengths.

Prompts are built lazily (`SimRequest.token_ids()`), when a request arrives: a trace of
thousands of long prompts never sits in memory at once. A prompt is made of segments, each a
deterministic block of token ids drawn from a generator seeded by the segment's id, so equal
ids give equal tokens and real prefix sharing (Mooncake's hash ids), and a request with its
own ids shares nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Segment ids of prompts that share nothing start here, far above any trace's hash ids.
_PRIVATE_BASE = 1 << 40


@dataclass(frozen=True)
class SimRequest:
    """`segment_ids`: the prompt's blocks of `segment_tokens` token ids each, the last cut
    so the prompt has `num_prompt_tokens` tokens."""

    request_id: str
    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    segment_ids: tuple[int, ...]
    segment_tokens: int
    vocab_size: int
    seed: int = 0
    prompt: tuple[int, ...] | None = None  # explicit token ids instead of segments

    @classmethod
    def of_tokens(
        cls, request_id: str, arrival_s: float, token_ids: list[int], num_output_tokens: int
    ) -> SimRequest:
        return cls(
            request_id, arrival_s, len(token_ids), num_output_tokens, (), 16, 0, 0, tuple(token_ids)
        )

    def token_ids(self) -> list[int]:
        if self.prompt is not None:
            return list(self.prompt[: self.num_prompt_tokens])
        parts = [self._segment(s) for s in self.segment_ids]
        tokens = np.concatenate(parts)[: self.num_prompt_tokens] if parts else np.zeros(0)
        return tokens.astype(np.int64).tolist()

    def _segment(self, segment_id: int) -> np.ndarray:
        rng = np.random.default_rng((self.seed, segment_id))
        return rng.integers(0, self.vocab_size, self.segment_tokens)


def private_segments(index: int, num_tokens: int, segment_tokens: int) -> tuple[int, ...]:
    """Segment ids that no other request uses."""
    n = -(-num_tokens // segment_tokens)
    base = _PRIVATE_BASE + index * (1 << 20)
    return tuple(range(base, base + n))


def synthetic(
    num_requests: int,
    rate: float,
    prompt_tokens: tuple[int, int],
    output_tokens: tuple[int, int],
    vocab_size: int,
    shared_prefix_tokens: int = 0,
    seed: int = 0,
) -> list[SimRequest]:
    """Poisson arrivals at `rate` requests/s, lengths uniform in the inclusive ranges, and
    optionally a common prefix (a system prompt) of `shared_prefix_tokens` on every prompt."""
    if rate <= 0 or num_requests < 1:
        raise ValueError("rate must be positive and num_requests at least 1")
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, num_requests))
    seg = 16
    requests = []
    for i in range(num_requests):
        n_in = int(rng.integers(prompt_tokens[0], prompt_tokens[1] + 1))
        n_out = int(rng.integers(output_tokens[0], output_tokens[1] + 1))
        shared = shared_prefix_tokens // seg
        own = private_segments(i, max(n_in - shared * seg, 1), seg)
        segments = tuple(range(shared)) + own
        n_in = max(n_in, shared * seg + 1)
        requests.append(
            SimRequest(f"syn-{i}", float(arrivals[i]), n_in, n_out, segments, seg, vocab_size, seed)
        )
    return requests


def scale_load(requests: Sequence[SimRequest], factor: float) -> list[SimRequest]:
    """Replay at `factor` times the load: arrival times divided by it."""
    if factor <= 0:
        raise ValueError("the load factor must be positive")
    return [dataclasses.replace(r, arrival_s=r.arrival_s / factor) for r in requests]


def fit_lengths(requests: Sequence[SimRequest], max_model_len: int) -> list[SimRequest]:
    """Cut outputs to `max_model_len - 1`, then prompts at their end so prompt + output
    fits (the shared prefixes stay), as a client would before sending."""
    fitted = []
    for r in requests:
        n_out = min(r.num_output_tokens, max_model_len - 1)
        n_in = min(r.num_prompt_tokens, max_model_len - n_out)
        fitted.append(dataclasses.replace(r, num_prompt_tokens=n_in, num_output_tokens=n_out))
    return fitted
