"""A day of traffic for `planner_day.py`: an hourly request rate on a diurnal curve
(`Diurnal`), a sample window of each hour (`hour_window`) with prompt and output lengths
drawn from a trace, and a simulated window as one interval of a router's metrics
(`traffic_of`), the way the planner reads a live deployment."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest

from tandem.planner.traffic import RouterScrape, TrafficWindow, window
from tandem.router.metrics import RouterMetrics
from tandem.router.phase_metrics import ChoiceClock
from tandem.sim.cluster import RequestRecord
from tandem.sim.traces import read_trace
from tandem.sim.workload import SimRequest, private_segments

SEGMENT_TOKENS = 16


@dataclass(frozen=True)
class Diurnal:
    """A cosine over 24 hours between `trough_rps` and `peak_rps`, highest at `peak_hour`
    (hours since midnight) and lowest twelve hours away from it."""

    trough_rps: float
    peak_rps: float
    peak_hour: float = 14.5

    def __post_init__(self) -> None:
        if not 0 < self.trough_rps <= self.peak_rps:
            raise ValueError(f"a diurnal curve needs 0 < trough <= peak, got {self}")

    def rate_at(self, hour: float) -> float:
        swing = (1.0 + math.cos(2.0 * math.pi * (hour - self.peak_hour) / 24.0)) / 2.0
        return self.trough_rps + (self.peak_rps - self.trough_rps) * swing

    def hour_rate(self, hour: int) -> float:
        """The rate of hour `hour` (0-23, or any integer, modulo a day): at its middle."""
        return self.rate_at(hour % 24 + 0.5)


@dataclass(frozen=True)
class TraceLengths:
    """(prompt, output) token counts of a trace's requests, drawn as pairs."""

    prompts: np.ndarray  # (num_requests,) int
    outputs: np.ndarray  # (num_requests,) int

    @classmethod
    def read(cls, path: str | Path, max_requests: int | None = None) -> TraceLengths:
        requests = read_trace(path, vocab_size=1, max_requests=max_requests)
        prompts = np.array([r.num_prompt_tokens for r in requests])
        return cls(prompts, np.array([r.num_output_tokens for r in requests]))


def hour_window(
    lengths: TraceLengths, rate_rps: float, window_s: float, vocab_size: int, seed: int
) -> list[SimRequest]:
    """Poisson arrivals at `rate_rps` over `window_s` seconds (at least one request), each
    with the lengths of a trace request drawn at random; prompts share nothing (the Azure
    traces say nothing of sharing)."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate_rps, max(1, math.ceil(rate_rps * window_s * 1.5) + 10))
    arrivals = np.cumsum(gaps)
    arrivals = arrivals[arrivals < window_s] if arrivals[0] < window_s else arrivals[:1]
    picks = rng.integers(0, len(lengths.prompts), len(arrivals))
    requests = []
    for i, (arrival, pick) in enumerate(zip(arrivals, picks)):
        n_in, n_out = int(lengths.prompts[pick]), int(lengths.outputs[pick])
        segments = private_segments(i, n_in, SEGMENT_TOKENS)
        requests.append(
            SimRequest(f"day-{i}", float(arrival), n_in, n_out, segments, SEGMENT_TOKENS,
                       vocab_size, seed)
        )  # fmt: skip
    return requests


def traffic_of(records: Sequence[RequestRecord], seconds: float, block_size: int) -> TrafficWindow:
    """The requests of one simulated window as a router's metrics over `seconds`: a real
    `RouterMetrics` fed with each finished request's lengths and client-side times (one
    that failed counts as ended, as the router counts it), its Prometheus text parsed as
    the planner parses a router's scrape."""
    metrics = RouterMetrics(CollectorRegistry(), "m", "bench")
    before = {"r": RouterScrape.parse(generate_latest(metrics.registry).decode())}
    for r in records:
        if r.outcome != "finished" or r.first_token_s is None or r.finish_s is None:
            metrics.phases.observe(ChoiceClock(start=0.0), failed=True)  # ended, unmeasured
            continue
        metrics.phases.observe(_clock(r))
        metrics.child(metrics.ttft).observe(r.first_token_s - r.arrival_s)
    after = {"r": RouterScrape.parse(generate_latest(metrics.registry).decode())}
    return window(before, after, seconds, block_size)


def _clock(r: RequestRecord) -> ChoiceClock:
    """The router's clock of a finished request, in seconds since its arrival (> 0: a
    `received_at` of 0 would read as unset)."""
    clock = ChoiceClock(start=0.0)
    first, last = r.first_token_s - r.arrival_s, r.finish_s - r.arrival_s
    usage = {"prompt_tokens": r.num_prompt_tokens, "completion_tokens": r.num_output_tokens}
    if r.num_output_tokens > 1:
        clock.on_record({"token_ids": [1], "finish_reason": None, "received_at": first})
    clock.on_record(
        {"token_ids": [1], "finish_reason": "length", "received_at": last, "usage": usage}
    )
    return clock
