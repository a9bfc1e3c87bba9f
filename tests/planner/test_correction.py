"""The step model learns how much slower the real steps are than the profile says."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tandem.planner.correction import MAX_SCALE, StepCorrection
from tandem.planner.layout_search import Layout, LayoutSearch
from tandem.sim.cluster import ClusterConfig
from tandem.sim.profiles import load_profile
from tandem.sim.results import SLO
from tandem.sim.shapes import SHAPES
from tandem.sim.workload import synthetic

SHAPE, H100 = SHAPES["llama-3-8b"], load_profile("h100")


def medians(profile, requests) -> tuple[float, float]:
    s = LayoutSearch(ClusterConfig(), SHAPE, profile, requests, SLO(10.0, 1.0), 0.9)
    p = s.predict(Layout(1, 1), whole=True)
    return p.tpot_p50_s, p.ttft_p50_s


def test_a_deployment_slower_than_its_profile_is_learnt_within_a_few_intervals():
    """The 'real' deployment: the same simulator with decode steps 2.5x and prefill steps
    1.5x the profile's; the planner sees only its medians."""
    requests = synthetic(60, 2.0, (256, 1024), (32, 128), SHAPE.vocab_size, seed=3)
    real = medians(replace(H100, decode_step_scale=2.5, prefill_step_scale=1.5), requests)
    c = StepCorrection()
    for _ in range(8):
        tpot, ttft = medians(c.apply(H100), requests)
        c.observe("tpot", real[0], tpot)
        c.observe("ttft", real[1], ttft)
    assert c.scales["decode"] == pytest.approx(2.5, rel=0.1)
    assert c.scales["prefill"] == pytest.approx(1.5, rel=0.25)
    assert abs(c.errors["tpot"]) < 0.1 and c.corrected


def test_no_learning_without_figures_or_when_told_not_to_and_scales_are_bounded():
    c = StepCorrection()
    c.observe("tpot", None, 0.01)
    c.observe("tpot", 0.02, 0.0)
    assert c.errors == {} and not c.corrected
    c.observe("tpot", 0.03, 0.01, learn=False)
    assert c.errors["tpot"] == pytest.approx(2.0) and not c.corrected
    for _ in range(50):
        c.observe("tpot", 1e6, 1e-6)
    assert c.scales["decode"] == MAX_SCALE
