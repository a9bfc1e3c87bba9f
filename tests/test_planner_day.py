"""The pieces of `bench/planner_day.py`, the simulated day of the SLO planner: the diurnal
curve, an hour's sample window, a window as the router's metrics, the warm-up a window's
figures leave out, and the HPA's rule."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from tests.bench_run import BENCH

sys.path.insert(0, str(BENCH))

from day_hour import serve_window
from day_policies import hpa_replicas
from diurnal import Diurnal, TraceLengths, hour_window, traffic_of

from tandem.planner.layout_search import Bounds
from tandem.sim.cluster import ClusterConfig, RequestRecord
from tandem.sim.profiles import load_profile
from tandem.sim.results import SLO
from tandem.sim.shapes import SHAPES
from tandem.sim.workload import SimRequest

SHAPE = SHAPES["llama-3-8b"]


def test_the_curve_peaks_at_its_hour_and_bottoms_twelve_hours_away():
    curve = Diurnal(30.0, 105.0, peak_hour=14.5)
    assert curve.rate_at(14.5) == pytest.approx(105.0)
    assert curve.rate_at(2.5) == pytest.approx(30.0)
    assert curve.hour_rate(14) == pytest.approx(105.0)  # an hour's rate is its middle's
    assert curve.hour_rate(-1) == curve.hour_rate(23)
    assert max(range(24), key=curve.hour_rate) == 14
    with pytest.raises(ValueError):
        Diurnal(50.0, 40.0)


def test_an_hour_window_has_its_rate_and_the_trace_lengths():
    lengths = TraceLengths(np.array([100, 200, 300]), np.array([5, 6, 7]))
    requests = hour_window(lengths, 50.0, 20.0, SHAPE.vocab_size, seed=3)
    assert 800 < len(requests) < 1200
    assert all(0 <= r.arrival_s < 20.0 for r in requests)
    pairs = {(r.num_prompt_tokens, r.num_output_tokens) for r in requests}
    assert pairs == {(100, 5), (200, 6), (300, 7)}
    again = hour_window(lengths, 50.0, 20.0, SHAPE.vocab_size, seed=3)
    assert [r.arrival_s for r in again] == [r.arrival_s for r in requests]


def test_a_window_reads_as_the_router_would_have_measured_it():
    records = [
        RequestRecord(f"r{i}", i * 0.5, 64, 11, first_token_s=i * 0.5 + 0.4,
                      finish_s=i * 0.5 + 0.4 + 10 * 0.05, outcome="finished")
        for i in range(19)
    ]  # fmt: skip
    records.append(RequestRecord("failed", 9.5, 64, 11, outcome="error"))
    traffic = traffic_of(records, 10.0, 16)
    assert traffic.rate_rps == pytest.approx(2.0)  # every request ended: 20 in 10 s
    assert traffic.finished == 19
    assert traffic.attainment(2.0, 0.1) == pytest.approx(1.0)
    assert traffic.attainment(0.2, 0.1) == pytest.approx(0.0)


def test_a_window_counts_only_what_arrives_after_its_warmup():
    config = ClusterConfig(num_prefill=1, num_decode=1, num_kv_blocks=256, max_model_len=1024)
    requests = [SimRequest.of_tokens(f"r{i}", i * 0.1, [3 + i] * 64, 4) for i in range(20)]
    run = serve_window(config, SHAPE, load_profile("h100"), requests, SLO(), warmup_s=1.0)
    assert [r.request_id for r in run.records] == [f"r{i}" for i in range(10, 20)]
    assert run.summary["num_requests"] == 10
    assert set(run.pools) == {"prefill", "decode"}
    assert 0.0 < run.pools["decode"].kv_usage < 1.0
    assert run.pools["prefill"].waiting >= 0.0


@pytest.mark.parametrize(
    ("current", "observed", "target", "wanted"),
    [
        (2, 8.0, 4.0, 4),  # twice the target: twice the pods
        (3, 4.3, 4.0, 3),  # within the 10% tolerance: held
        (3, 5.0, 4.0, 4),  # ceil(3.75)
        (4, 0.0, 4.0, 1),  # nothing waiting: the minimum
        (4, 40.0, 4.0, 8),  # at most the maximum
        (2, 0.3, 0.8, 1),  # KV usage: ceil(0.75)
    ],
)
def test_the_hpa_scales_by_the_ratio_of_observed_to_target_within_bounds(
    current, observed, target, wanted
):
    assert hpa_replicas(current, observed, target, Bounds(1, 8)) == wanted
