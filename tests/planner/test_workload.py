"""The workload the planner simulates looks like the interval the routers measured."""

from __future__ import annotations

import numpy as np
import pytest

from tandem.planner.traffic import window
from tandem.planner.workload import SEGMENT_TOKENS, observed_workload
from tests.planner.test_traffic import Router


def test_rate_lengths_and_shared_prefix_follow_the_window():
    router = Router("r")
    before = {"r": router.scrape()}
    for n in (300, 400, 600, 700) * 25:
        router.finish(n, 30, 0.1, 0.01)
    router.metrics.child(router.metrics.prefix_blocks, tier="device").inc(25_000 // 16)
    t = window(before, {"r": router.scrape()}, 20.0, 16)  # 100 requests, 50,000 tokens
    assert t.rate_rps == 5.0 and t.prefix_hit_rate == pytest.approx(0.5, abs=1e-3)
    requests = observed_workload(t, 2000, 1000, seed=0)
    gaps = np.diff([r.arrival_s for r in requests])
    assert gaps.mean() == pytest.approx(0.2, rel=0.1)
    prompts = np.array([r.num_prompt_tokens for r in requests])
    assert prompts.min() >= 200 and prompts.max() <= 1000  # the (200, 500], (500, 1000] buckets
    outputs = np.array([r.num_output_tokens for r in requests])
    assert outputs.min() >= 20 and outputs.max() <= 50
    # the first tokens of every prompt are one common prefix: half of all tokens, as measured
    prefix = np.array([len([s for s in r.segment_ids if s < 1 << 40]) for r in requests])
    shared = (prefix * SEGMENT_TOKENS).sum() / prompts.sum()
    assert shared == pytest.approx(0.5, abs=SEGMENT_TOKENS / prompts.mean())
    a, b = requests[0].token_ids(), requests[1].token_ids()
    common = min(prefix[0], prefix[1]) * SEGMENT_TOKENS
    assert a[:common] == b[:common] and common > 0


def test_a_window_without_finished_requests_cannot_be_modelled():
    r = Router("r")
    with pytest.raises(ValueError, match="no finished request"):
        observed_workload(window({}, {"r": r.scrape()}, 10.0, 16), 10, 100)
