"""The workload the planner simulates (`observed_workload`): requests drawn to look like a
`TrafficWindow`: Poisson arrivals at its rate, prompt and output lengths from its
histograms, and a prefix shared across prompts as long as its hit rate says."""

from __future__ import annotations

import numpy as np

from tandem.planner.traffic import GENERATED, PROMPT, TrafficWindow
from tandem.sim.workload import SimRequest, private_segments

SEGMENT_TOKENS = 16


def observed_workload(
    traffic: TrafficWindow, num_requests: int, vocab_size: int, seed: int = 0
) -> list[SimRequest]:
    """`num_requests` requests like those of `traffic` (which must have finished some).

    Every prompt starts with the first `hit rate x its length` tokens of one common prefix,
    so a cache that holds it finds that share of the prompt tokens, as the routers measured.
    """
    if traffic.finished <= 0 or traffic.rate_rps <= 0:
        raise ValueError("no finished request in the window to model the workload on")
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / traffic.rate_rps, num_requests))
    prompts = np.maximum(1, np.ceil(traffic.histograms[PROMPT].draw(rng, num_requests)))
    outputs = np.maximum(1, np.ceil(traffic.histograms[GENERATED].draw(rng, num_requests)))
    hit = traffic.prefix_hit_rate
    requests = []
    for i in range(num_requests):
        n_in = int(prompts[i])
        shared = int(hit * n_in) // SEGMENT_TOKENS
        own = private_segments(i, max(n_in - shared * SEGMENT_TOKENS, 1), SEGMENT_TOKENS)
        n_in = max(n_in, shared * SEGMENT_TOKENS + 1)
        segments = tuple(range(shared)) + own
        request = SimRequest(
            f"obs-{i}", float(arrivals[i]), n_in, int(outputs[i]), segments, SEGMENT_TOKENS,
            vocab_size, seed,
        )  # fmt: skip
        requests.append(request)
    return requests
