"""How much the prefill steps on one CPU host slow the decode steps beside them, from the
nodes' step logs (`GET /debug/steps`: each step's start on the host's monotonic clock, its
runner's wall time and CPU time).

Beyond their share of the cores, a prefill step's matrix products evict a decode step's
weights and KV from the shared caches and take the memory bandwidth: the same decode batch
costs more CPU while prefill steps run. The model (`SharedCores.interference`): a decode
step's work grows by `k` per prefill step running beside it. Measured here as the slope of
each decode step's runner CPU, against what a profile fitted on all steps predicts for its
batch, over the prefill steps overlapping it: ratio = a (1 + k x overlap).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence

import numpy as np

from tandem.sim.calibration import step_residuals
from tandem.sim.profiles import DeviceProfile
from tandem.sim.shapes import ModelShape

# Fewer decode steps than this with a prefill step beside them, or alone: no interference
# is fitted (the slope would be noise).
MIN_STEPS = 20

Record = Mapping[str, float]


def prefill_overlaps(decode: Sequence[Record], prefill: Sequence[Record]) -> list[float]:
    """Per decode step, the prefill steps running while its runner ran, averaged over its
    runner's wall time (0: none; 2: two all along)."""
    spans = sorted((r["start_s"], r["start_s"] + r["execute_s"]) for r in prefill)
    starts = [s for s, _ in spans]
    longest = max((e - s for s, e in spans), default=0.0)
    out = []
    for r in decode:
        begin, end = r["start_s"], r["start_s"] + r["execute_s"]
        first = bisect.bisect_left(starts, begin - longest)
        last = bisect.bisect_right(starts, end)
        covered = sum(max(0.0, min(end, e) - max(begin, s)) for s, e in spans[first:last])
        out.append(covered / (end - begin) if end > begin else 0.0)
    return out


def fit_interference(
    decode: Sequence[Record], overlaps: Sequence[float], shape: ModelShape, profile: DeviceProfile
) -> float:
    """`k`, from the decode steps' runner CPU over `profile`'s prediction for each batch
    against their `overlaps`; 0 with too few steps alone or beside a prefill step, or a
    slope that is not positive."""
    ratio = np.exp(step_residuals(decode, shape, profile))  # over the runner's part alone
    x = np.asarray(overlaps, dtype=float)
    if min(int((x == 0).sum()), int((x > 0).sum())) < MIN_STEPS:
        return 0.0
    slope, intercept = np.polyfit(x, ratio, 1)
    return float(slope / intercept) if slope > 0 and intercept > 0 else 0.0


def without_interference(
    decode: Sequence[Record], overlaps: Sequence[float], k: float
) -> list[dict[str, float]]:
    """The decode steps with their runner CPU as it would have been with no prefill step
    beside them, for fitting the engine's own constants."""
    return [
        {**r, "execute_cpu_s": r["execute_cpu_s"] / (1.0 + k * x)} for r, x in zip(decode, overlaps)
    ]
