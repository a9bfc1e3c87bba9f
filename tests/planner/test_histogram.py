"""Bucket counts as the planner reads them: differences, quantiles, shares and draws."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tandem.planner.histogram import BucketCounts

INF = math.inf


def counts(values, bounds=(1.0, 2.0, 4.0, INF)) -> BucketCounts:
    cumulative = tuple(float(sum(v <= b for v in values)) for b in bounds)
    return BucketCounts(bounds, cumulative, float(sum(values)))


def test_quantiles_and_shares_interpolate_within_a_bucket():
    h = counts([0.5, 1.5, 1.5, 3.0])  # buckets: 1 | 2 | 1 | 0
    assert h.count == 4
    assert h.quantile(0.25) == pytest.approx(1.0)  # the end of the first bucket
    assert h.quantile(0.5) == pytest.approx(1.5)  # half-way through (1, 2]
    assert h.quantile(1.0) == pytest.approx(4.0)
    assert h.share_at_most(1.5) == pytest.approx(0.5)
    assert h.share_at_most(4.0) == 1.0
    assert counts([]).quantile(0.5) is None and counts([]).share_at_most(1.0) is None


def test_the_last_bucket_answers_its_lower_bound():
    h = counts([10.0, 20.0])
    assert h.quantile(0.9) == 4.0
    assert h.share_at_most(100.0) == 0.0  # unknown beyond the last finite bound


def test_since_subtracts_and_a_reset_counter_counts_from_zero():
    before, after = counts([0.5, 3.0]), counts([0.5, 3.0, 1.5, 1.7])
    delta = after.since(before)
    assert delta.cumulative == (0.0, 2.0, 2.0, 2.0)
    assert delta.total == pytest.approx(3.2)
    restarted = counts([0.5])
    assert restarted.since(after) == restarted
    assert after.since(None) == after
    with pytest.raises(ValueError, match="bounds differ"):
        after.since(counts([1.0], bounds=(1.0, INF)))


def test_draws_follow_the_buckets():
    h = counts([0.5] * 300 + [3.0] * 100)
    drawn = h.draw(np.random.default_rng(0), 4000)
    assert ((drawn > 0) & (drawn <= 1.0)).mean() == pytest.approx(0.75, abs=0.03)
    assert ((drawn > 2.0) & (drawn <= 4.0)).mean() == pytest.approx(0.25, abs=0.03)
    assert not ((drawn > 1.0) & (drawn <= 2.0)).any()
    with pytest.raises(ValueError):
        counts([]).draw(np.random.default_rng(0), 1)
