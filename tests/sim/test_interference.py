"""Prefill steps' interference with decode steps on one host, from step logs."""

import numpy as np
import pytest

from tandem.sim.interference import (
    MIN_STEPS,
    fit_interference,
    prefill_overlaps,
    without_interference,
)
from tandem.sim.shapes import SHAPES
from tandem.sim.step_model import StepShape, StepTimeModel
from tests.sim.test_calibration import cpu_truth, log_record


def span(start: float, seconds: float, cpu: float = 0.0) -> dict:
    return {"start_s": start, "execute_s": seconds, "execute_cpu_s": cpu}


def test_overlap_is_the_prefill_steps_beside_a_step_averaged_over_its_runner():
    prefill = [span(1.0, 1.0), span(1.5, 1.0), span(10.0, 5.0)]
    decode = [
        span(0.0, 0.5),  # before any
        span(0.5, 1.0),  # half of it beside the first
        span(1.5, 0.5),  # beside both all along
        span(2.25, 0.5),  # the second for half of it
        span(12.0, 1.0),  # inside the long one that started earlier
    ]
    got = prefill_overlaps(decode, prefill)
    assert got == pytest.approx([0.0, 0.5, 2.0, 0.5, 1.0])
    assert prefill_overlaps(decode, []) == [0.0] * 5


def test_the_fit_recovers_a_known_interference_and_the_engine_alone():
    # decode batches whose runner CPU is the engine's time x (1 + 0.15 x overlap), the
    # overlap drawn from 0-2; the fit finds 0.15, and the steps' CPU without it is the
    # engine's own again
    shape, truth = SHAPES["llama-3-8b"], cpu_truth()
    model = StepTimeModel(shape, truth, 1, "decode")
    rng = np.random.default_rng(3)
    k = 0.15
    records, overlaps = [], []
    for i in range(200):
        n = int(rng.integers(1, 8))
        step = StepShape.of([1] * n, [int(c) for c in rng.integers(50, 900, n)], n)
        x = 0.0 if i % 3 == 0 else float(rng.uniform(0.0, 2.0))
        records.append(log_record(step, model.step_time(step) * (1 + k * x), None))
        overlaps.append(x)
    assert fit_interference(records, overlaps, shape, truth) == pytest.approx(k, rel=1e-6)
    alone = without_interference(records, overlaps, k)
    for r, a in zip(records, alone):
        assert a["execute_cpu_s"] == pytest.approx(
            r["execute_cpu_s"] / (1 + k * overlaps[records.index(r)])
        )
    # fewer than MIN_STEPS steps alone (or beside a prefill step): nothing fitted
    assert fit_interference(records, [1.0] * len(records), shape, truth) == 0.0
    beside = [x if x else 1.0 for x in overlaps]  # none alone but the first MIN_STEPS - 1
    few = [0.0] * (MIN_STEPS - 1) + beside[MIN_STEPS - 1 :]
    assert fit_interference(records, few, shape, truth) == 0.0
    enough = [0.0] * MIN_STEPS + beside[MIN_STEPS:]
    assert fit_interference(records, enough, shape, truth) > 0.0
    # steps beside a prefill step that cost less: no interference, not a negative one
    step = StepShape.of([1], [100], 1)
    faster = [log_record(step, 1e-3, None)] * 30 + [log_record(step, 0.9e-3, None)] * 30
    spread = [0.0] * 30 + [1.0] * 30
    assert fit_interference(faster, spread, shape, truth) == 0.0
