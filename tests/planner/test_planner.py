"""One planning step end to end: a router's metrics of an interval in, the replicas to set
out, with the figures and the reason."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from tandem.planner.layout_search import Bounds, Layout
from tandem.planner.planner import Planner, PlannerSettings
from tandem.planner.stabilizer import Stabilizer
from tandem.planner.traffic import window
from tandem.sim.cluster import ClusterConfig
from tandem.sim.profiles import load_profile
from tandem.sim.results import SLO
from tandem.sim.shapes import SHAPES
from tests.planner.test_traffic import Router

SETTINGS = PlannerSettings(
    slo=SLO(ttft_s=0.5, tpot_s=0.05), attainment=0.9,
    prefill=Bounds(1, 3), decode=Bounds(1, 4),
    base=ClusterConfig(remote_prefill_threshold=0), shape=SHAPES["llama-3-8b"],
    profile=load_profile("h100"), num_requests=80, max_requests=400,
)  # fmt: skip


def interval(router: Router, requests: int, seconds: float, ttft: float = 0.1):
    """`requests` finished over `seconds` with 512-2048-token prompts, each with `ttft`."""
    before = {"r": router.scrape()}
    rng = np.random.default_rng(requests)
    for n in rng.integers(512, 2049, requests):
        router.finish(int(n), 128, ttft, 0.012)
    return window(before, {"r": router.scrape()}, seconds, 16)


def test_load_scales_the_pools_up_at_once_and_down_after_the_window():
    planner = Planner(SETTINGS, Stabilizer(down_window_s=120.0, cooldown_s=30.0))
    router = Router("r")
    # 60 req/s, more than 1P+1D serves: its measured TTFT is far past the target
    busy = planner.decide(0.0, Layout(1, 1), interval(router, 1800, 30.0, ttft=3.0))
    assert busy.changed and busy.target == busy.planned
    assert busy.target.prefill + busy.target.decode > 2
    assert busy.predicted_attainment >= 0.9 and busy.measured_attainment == 0.0
    assert busy.current_attainment < 0.9
    assert not planner.correction.corrected  # no learning from an overloaded interval
    assert busy.simulations > 1 and busy.search_s > 0
    assert "1P+1D -> " in busy.reason
    quiet = planner.decide(30.0, busy.target, interval(router, 60, 30.0))  # 2 req/s
    assert quiet.planned == Layout(1, 1)
    assert quiet.target == busy.target and "held" in quiet.reason
    later = planner.decide(151.0, quiet.target, interval(router, 60, 30.0))
    assert later.target == Layout(1, 1)
    status = later.as_status()
    assert status["prefill"] == {"current": busy.target.prefill, "desired": 1}
    assert status["requestRate"] == 2.0


def test_an_idle_interval_plans_the_minimum_and_simulates_nothing():
    planner = Planner(SETTINGS, Stabilizer(down_window_s=0.0, cooldown_s=0.0))
    router = Router("r")
    idle = planner.decide(0.0, Layout(2, 3), interval(router, 0, 30.0))
    assert idle.simulations == 0 and idle.measured_attainment is None
    assert idle.target == Layout(1, 1)
    assert idle.reason == (
        "0 requests finished in the interval (fewer than 10): planned the minimum 1P+1D; "
        "2P+3D -> 1P+1D"
    )


def test_beyond_the_bounds_it_plans_the_maximum_and_says_so():
    tight = replace(SETTINGS, prefill=Bounds(1, 1), decode=Bounds(1, 2))
    decision = Planner(tight).decide(0.0, Layout(1, 1), interval(Router("r"), 2400, 30.0, 3.0))
    assert decision.target == Layout(1, 2) and decision.predicted_attainment is None
    assert "predictedAttainment" not in decision.as_status()  # no null in the status
    assert "no layout within the bounds" in decision.reason


def test_a_missed_target_the_simulator_calls_met_adds_a_pod_to_its_pool():
    """2 req/s needs 1P+1D by the simulator, but the routers measured every first token
    late: the model is optimistic here, so the planner scales nothing down and adds a
    prefill pod (TTFT's pool), saying why; once prefill is at its maximum, a decode pod."""
    planner = Planner(SETTINGS, Stabilizer(down_window_s=0.0, cooldown_s=0.0))
    late = planner.decide(0.0, Layout(2, 3), interval(Router("r"), 60, 30.0, ttft=3.0))
    assert late.target == Layout(3, 3) and late.measured_attainment == 0.0
    assert late.current_attainment >= 0.9
    assert late.reason.endswith(
        "the routers measured 0%: the simulator calls 2P+3D fine; TTFT missed: at least "
        "3P+3D; 2P+3D -> 3P+3D"
    )
    top = planner.decide(30.0, late.target, interval(Router("r"), 60, 30.0, ttft=3.0))
    assert top.target == Layout(3, 4)  # prefill at its maximum (3): decode
    on_time = Planner(SETTINGS, Stabilizer(down_window_s=0.0, cooldown_s=0.0))
    assert on_time.decide(0.0, Layout(2, 3), interval(Router("r"), 60, 30.0)).target == Layout(1, 1)


def test_the_modelled_workload_spans_the_horizon_within_its_bounds():
    settings = replace(SETTINGS, max_requests=2000)
    assert settings.workload_size(0.5) == 80  # the least (num_requests)
    assert settings.workload_size(10.0) == 600  # 60 s of traffic
    assert settings.workload_size(100.0) == 2000  # the most


def test_a_pinned_prefill_pool_is_relieved_by_a_threshold_once_it_has_held_a_window():
    """30 req/s with one prefill pod (its bounds 1..1): at threshold 0 every prompt queues
    on it and no decode count helps; at 1,024 the shorter prompts prefill on decode and
    1P+1D meets the SLOs. The planner finds that and changes the threshold only after a
    window of the same plan."""
    pinned = replace(SETTINGS, prefill=Bounds(1, 1), thresholds=(0, 1024))
    planner = Planner(pinned, Stabilizer(down_window_s=60.0, cooldown_s=0.0))
    router = Router("r")
    first = planner.decide(0.0, Layout(1, 4, 0), interval(router, 900, 30.0, ttft=3.0))
    # the cheapest is 1P+1D@1024; the routers measured every request late: decode kept
    assert first.planned == Layout(1, 4, 1024) and first.predicted_attainment >= 0.9
    assert first.target == Layout(1, 4, 0)  # held: the threshold's window
    assert "1P+1D@1024 is the cheapest" in first.reason and "held" in first.reason
    later = planner.decide(60.0, first.target, interval(router, 900, 30.0, ttft=3.0))
    assert later.target == Layout(1, 4, 1024)  # the threshold now; decode still measured late
    alone = replace(pinned, thresholds=())
    stuck = Planner(alone).decide(0.0, Layout(1, 4, 0), interval(Router("r"), 900, 30.0, 3.0))
    assert stuck.planned == Layout(1, 4, 0) and "no layout within the bounds" in stuck.reason
