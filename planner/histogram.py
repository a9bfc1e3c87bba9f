"""A Prometheus histogram as the planner reads it (`BucketCounts`): cumulative counts per
upper bound, differences between two scrapes, quantiles and shares interpolated within a
bucket as PromQL's `histogram_quantile` does, and draws from the distribution."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BucketCounts:
    """`bounds`: the buckets' upper bounds, ascending, the last `inf`; `cumulative`: the
    observations at or below each (so the last is the count); `total`: their sum."""

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]
    total: float = 0.0

    @classmethod
    def empty(cls, bounds: Sequence[float]) -> BucketCounts:
        return cls(tuple(bounds), (0.0,) * len(bounds))

    @property
    def count(self) -> float:
        return self.cumulative[-1] if self.cumulative else 0.0

    def plus(self, other: BucketCounts) -> BucketCounts:
        """The sum of both; an empty one (a histogram with no series yet) adds nothing."""
        if not other.bounds:
            return self
        if not self.bounds:
            return other
        self._check(other)
        cumulative = tuple(a + b for a, b in zip(self.cumulative, other.cumulative))
        return BucketCounts(self.bounds, cumulative, self.total + other.total)

    def since(self, earlier: BucketCounts | None) -> BucketCounts:
        """The observations after `earlier`; all of them when the counter was reset (a
        restarted process) or there is no earlier scrape."""
        if earlier is None or not earlier.bounds or earlier.count > self.count:
            return self
        self._check(earlier)
        cumulative = tuple(max(0.0, a - b) for a, b in zip(self.cumulative, earlier.cumulative))
        return BucketCounts(self.bounds, cumulative, max(0.0, self.total - earlier.total))

    def quantile(self, q: float) -> float | None:
        """The `q` quantile, linear within its bucket (the first bucket from 0); the highest
        finite bound when it falls in the last. None without observations."""
        if self.count <= 0:
            return None
        rank = q * self.count
        lower, below = 0.0, 0.0
        for bound, cum in zip(self.bounds, self.cumulative):
            if cum >= rank and cum > below:
                if math.isinf(bound):
                    return lower
                return lower + (bound - lower) * (rank - below) / (cum - below)
            lower, below = bound, cum
        return lower

    def share_at_most(self, x: float) -> float | None:
        """The share of observations at or below `x`, linear within its bucket."""
        if self.count <= 0:
            return None
        lower, below = 0.0, 0.0
        for bound, cum in zip(self.bounds, self.cumulative):
            if x <= bound:
                if math.isinf(bound):
                    return below / self.count
                inside = (cum - below) * (x - lower) / (bound - lower) if bound > lower else 0.0
                return (below + inside) / self.count
            lower, below = bound, cum
        return 1.0

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:  # [n] float64
        """`n` values drawn from the distribution: a bucket by its share, then uniform within
        it; the last (unbounded) bucket at its lower bound. Needs observations."""
        counts = np.diff(np.asarray((0.0, *self.cumulative)))
        if counts.sum() <= 0:
            raise ValueError("no observations to draw from")
        buckets = rng.choice(len(counts), size=n, p=counts / counts.sum())
        uppers = np.asarray(self.bounds)
        lowers = np.concatenate(([0.0], uppers[:-1]))
        finite = np.where(np.isinf(uppers), lowers, uppers)
        return rng.uniform(lowers[buckets], finite[buckets])

    def _check(self, other: BucketCounts) -> None:
        if other.bounds and other.bounds != self.bounds:
            raise ValueError(f"bucket bounds differ: {self.bounds} vs {other.bounds}")
