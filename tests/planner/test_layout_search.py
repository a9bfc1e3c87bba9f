"""The planner's pruned search finds what an exhaustive one finds, in fewer simulations."""

from __future__ import annotations

import pytest

from tandem.planner.layout_search import Bounds, Layout, LayoutSearch
from tandem.sim.cluster import ClusterConfig
from tandem.sim.profiles import load_profile
from tandem.sim.results import SLO
from tandem.sim.shapes import SHAPES
from tandem.sim.workload import synthetic

SHAPE, H100 = SHAPES["llama-3-8b"], load_profile("h100")
SLOS = SLO(ttft_s=0.5, tpot_s=0.05)
PREFILL, DECODE = Bounds(0, 2), Bounds(1, 4)


def search(rate: float) -> LayoutSearch:
    requests = synthetic(80, rate, (512, 2048), (64, 256), SHAPE.vocab_size, seed=1)
    return LayoutSearch(ClusterConfig(), SHAPE, H100, requests, SLOS, 0.9)


@pytest.mark.parametrize("rate", [5.0, 60.0])
def test_the_pruned_search_finds_the_cheapest_layout_of_the_exhaustive_one(rate):
    pruned = search(rate)
    best = pruned.cheapest(PREFILL, DECODE)
    everything = search(rate)
    layouts = [
        Layout(p, d)
        for p in range(PREFILL.min_replicas, PREFILL.max_replicas + 1)
        for d in range(DECODE.min_replicas, DECODE.max_replicas + 1)
    ]
    meeting = [x for x in map(everything.predict, layouts) if x.meets]
    assert best is not None and best.meets
    assert best.devices == min(x.devices for x in meeting)
    assert pruned.simulations < len(layouts)


def test_more_traffic_needs_more_devices_and_bounds_hold():
    light = search(5.0).cheapest(PREFILL, DECODE)
    heavy = search(60.0).cheapest(PREFILL, DECODE)
    assert light.devices == 1 and heavy.devices > light.devices
    narrow = search(60.0).cheapest(Bounds(1, 1), Bounds(1, 1))
    assert narrow is None  # one prefill and one decode node cannot carry it
    pinned = search(5.0).cheapest(Bounds(1, 2), Bounds(2, 3))
    assert pinned.layout == Layout(1, 2)  # the minimums, when they meet


def test_a_whole_prediction_runs_to_the_end_and_is_kept():
    s = search(60.0)
    stopped = s.predict(Layout(0, 1))
    assert not stopped.meets
    whole = s.predict(Layout(0, 1), whole=True)
    assert whole.ttft_p50_s is not None and whole.attained < 0.9
    runs = s.simulations
    assert s.predict(Layout(0, 1)) == whole and s.simulations == runs


def test_a_layout_without_decode_nodes_is_predicted_not_to_meet():
    s = search(5.0)
    nothing = s.predict(Layout(1, 0), whole=True)
    assert not nothing.meets and nothing.attained is None


def test_a_layout_whose_model_does_not_fit_does_not_meet():
    tiny = ClusterConfig(tp_decode=1, max_model_len=8192)
    s = LayoutSearch(tiny, SHAPES["llama-3-70b"], H100, search(5.0).requests, SLOS, 0.9)
    assert not s.predict(Layout(0, 1)).meets
    assert s.cheapest(Bounds(0, 0), Bounds(1, 2)) is None


def test_a_search_at_a_threshold_simulates_it_and_a_ceiling_bounds_its_devices():
    s = search(20.0)
    remote = s.predict(Layout(1, 1, 0), whole=True)
    local = s.predict(Layout(1, 1, 10**6), whole=True)  # no prompt reaches it: all local
    assert remote.ttft_p50_s != local.ttft_p50_s
    found = s.cheapest(Bounds(1, 2), DECODE, threshold=10**6)
    assert found is not None and found.layout.threshold == 10**6
    assert s.cheapest(Bounds(1, 2), DECODE, threshold=10**6, max_devices=found.devices - 1) is None
    capped = search(60.0).cheapest(PREFILL, DECODE, max_devices=3)
    assert capped is None or capped.devices <= 3
