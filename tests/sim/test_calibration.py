"""The profile fit recovers the constants that made the step times."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tandem.sim.calibration import fit_profile, nonnegative_lstsq
from tandem.sim.profiles import load_profile
from tandem.sim.shapes import SHAPES
from tandem.sim.step_model import StepShape, StepTimeModel


def test_nonnegative_least_squares_drops_what_would_go_negative():
    a = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0]])
    assert nonnegative_lstsq(a, np.array([1.0, 2.0, 3.0])) == pytest.approx([1.0, 1.0])
    assert nonnegative_lstsq(a, np.array([3.0, 2.0, 1.0]))[1] == 0.0


def test_the_fit_recovers_a_known_cpu_profile():
    shape = SHAPES["llama-3-8b"]
    truth = dataclasses.replace(
        load_profile("h100"),
        peak_flops=2e11,
        mem_bandwidth=1.5e10,
        step_overhead_s=3e-3,
        seq_overhead_s=2e-4,
        overlap=False,
        compute_efficiency=1.0,
        bandwidth_efficiency=1.0,
    )
    model = StepTimeModel(shape, truth)
    rng = np.random.default_rng(0)
    samples = []
    for _ in range(40):
        n = int(rng.integers(1, 32))
        tokens = [int(t) for t in rng.integers(1, 200, n)]
        ctx = [t + int(c) for t, c in zip(tokens, rng.integers(0, 900, n))]
        step = StepShape(tokens, ctx, n)
        samples.append((step, model.step_time(step)))
    fit = fit_profile(samples, shape, load_profile("h100"))
    assert fit.median_rel_error < 1e-6
    assert fit.profile.peak_flops == pytest.approx(2e11, rel=1e-3)
    assert fit.profile.mem_bandwidth == pytest.approx(1.5e10, rel=1e-3)
    assert fit.profile.step_overhead_s == pytest.approx(3e-3, rel=1e-3)
    with pytest.raises(ValueError, match="at least 4"):
        fit_profile(samples[:2], shape, truth)
