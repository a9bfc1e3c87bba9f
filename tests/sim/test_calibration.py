"""The profile fits recover the constants that made the step times: from step shapes, and
from a node's step log (`GET /debug/steps` records), the engine's and the node's own."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from tandem.sim.calibration import (
    MIN_CYCLES,
    engine_run_length,
    fit_host_overhead,
    fit_logged_profile,
    fit_other_threads,
    fit_profile,
    fit_role_overhead,
    fit_spread,
    lag_correlation,
    logged_step,
    mean_host_overhead,
    mean_tail,
    nonnegative_lstsq,
    spread_of,
    step_residuals,
)
from tandem.sim.profiles import load_profile
from tandem.sim.shapes import SHAPES
from tandem.sim.step_model import StepShape, StepTimeModel


def test_nonnegative_least_squares_drops_what_would_go_negative():
    a = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0]])
    assert nonnegative_lstsq(a, np.array([1.0, 2.0, 3.0])) == pytest.approx([1.0, 1.0])
    assert nonnegative_lstsq(a, np.array([3.0, 2.0, 1.0]))[1] == 0.0


def cpu_truth():
    return dataclasses.replace(
        load_profile("h100"),
        peak_flops=2e11,
        mem_bandwidth=1.5e10,
        step_overhead_s=3e-3,
        seq_overhead_s=2e-4,
        overlap=False,
        compute_efficiency=1.0,
        bandwidth_efficiency=1.0,
        attention_efficiency=0.6,  # attention slower than the weight products, as on a CPU
    )


def random_steps(seed: int, count: int) -> list[StepShape]:
    rng = np.random.default_rng(seed)
    steps = []
    for _ in range(count):
        n = int(rng.integers(1, 32))
        tokens = [int(t) for t in rng.integers(1, 200, n)]
        ctx = [t + int(c) for t, c in zip(tokens, rng.integers(0, 900, n))]
        steps.append(StepShape.of(tokens, ctx, int(rng.integers(0, n + 1))))
    return steps


def test_the_fit_recovers_a_known_cpu_profile():
    shape, truth = SHAPES["llama-3-8b"], cpu_truth()
    model = StepTimeModel(shape, truth)
    samples = [(step, model.step_time(step)) for step in random_steps(0, 40)]
    fit = fit_profile(samples, shape, load_profile("h100"))
    assert fit.median_rel_error < 1e-6
    assert fit.profile.peak_flops == pytest.approx(2e11, rel=1e-3)
    assert fit.profile.mem_bandwidth == pytest.approx(1.5e10, rel=1e-3)
    assert fit.profile.step_overhead_s == pytest.approx(3e-3, rel=1e-3)
    assert fit.profile.attention_efficiency == pytest.approx(0.6, rel=1e-3)
    with pytest.raises(ValueError, match="at least 5"):
        fit_profile(samples[:4], shape, truth)


def test_attention_flops_run_at_the_profile_s_attention_efficiency():
    shape = SHAPES["llama-3-8b"]
    prefill = StepShape.of([512], [512], 1)  # long context: attention is a large part
    at_peak = StepTimeModel(shape, dataclasses.replace(cpu_truth(), attention_efficiency=1.0))
    slower = StepTimeModel(shape, cpu_truth())
    cost = at_peak.cost(prefill)
    assert 0 < cost.attention_flops < cost.flops
    extra = cost.attention_flops * (1 / 0.6 - 1) / cpu_truth().peak_flops
    assert slower.step_time(prefill) - at_peak.step_time(prefill) == pytest.approx(extra)
    with pytest.raises(ValueError, match="attention_efficiency"):
        dataclasses.replace(cpu_truth(), attention_efficiency=0.0)


def log_record(step: StepShape, execute_cpu_s: float, cycle_cpu_s: float | None) -> dict:
    """A step as `StepLog.since` serves it."""
    w = step.work
    return {
        "seq": 0, "num_seqs": w.num_seqs, "num_tokens": w.num_tokens,
        "num_context_tokens": w.num_context_tokens,
        "num_attention_pairs": w.num_attention_pairs, "num_sampled": step.num_sampled,
        "start_s": 0.0, "execute_s": execute_cpu_s, "execute_cpu_s": execute_cpu_s,
        "cycle_s": cycle_cpu_s, "cycle_cpu_s": cycle_cpu_s,
    }  # fmt: skip


def test_a_logged_step_is_the_step_it_logged():
    for step in random_steps(1, 10):
        assert logged_step(log_record(step, 1.0, None)) == step


def test_the_logged_fits_recover_the_engine_and_the_nodes_work_outside_it():
    shape, truth = SHAPES["llama-3-8b"], cpu_truth()
    model = StepTimeModel(shape, truth)
    outside = (4e-4, 1.5e-4)  # per step, per sequence
    records = []
    for i, step in enumerate(random_steps(2, 60)):
        runner = model.step_time(step)
        cycle = runner + outside[0] + outside[1] * step.num_seqs if i % 3 else None
        records.append(log_record(step, runner, cycle))
    fit = fit_logged_profile(records, shape, load_profile("h100"))
    assert fit.median_rel_error < 1e-6
    assert fit.profile.mem_bandwidth == pytest.approx(truth.mem_bandwidth, rel=1e-3)
    assert fit_host_overhead(records) == pytest.approx(outside, rel=1e-6)
    cycles = [r for r in records if r["cycle_cpu_s"] is not None]
    assert fit_host_overhead(cycles[: MIN_CYCLES - 1]) == (0.0, 0.0)  # too few to split


def test_the_steps_spread_around_the_model_and_whether_slow_steps_come_in_spells():
    shape, truth = SHAPES["llama-3-8b"], cpu_truth()
    model = StepTimeModel(shape, truth)
    steps, sigma = random_steps(4, 2000), 0.15
    z = np.random.default_rng(5).standard_normal(len(steps))
    spells = np.empty_like(z)  # each step's factor follows the last one's (unit variance)
    spells[0] = z[0]
    for i in range(1, len(z)):
        spells[i] = 0.8 * spells[i - 1] + 0.6 * z[i]

    def logged(noise: np.ndarray) -> list[dict]:
        times = [model.step_time(s) * math.exp(sigma * x) for s, x in zip(steps, noise)]
        return [log_record(s, t, None) for s, t in zip(steps, times)]

    independent = step_residuals(logged(z), shape, truth)
    assert independent == pytest.approx(sigma * z, abs=1e-9)
    # 2000 draws: the estimates' standard errors are ~1/45 of what they estimate, or less
    assert spread_of(independent) == pytest.approx(sigma, rel=0.1)
    assert abs(lag_correlation(independent)) < 0.1
    in_spells = step_residuals(logged(spells), shape, truth)
    assert spread_of(in_spells) == pytest.approx(sigma, rel=0.15)
    assert lag_correlation(in_spells) == pytest.approx(0.8, abs=0.1)
    # a few steps the host delayed (x20) do not set the spread; too few steps set nothing
    delayed = [*independent[:-20], *[math.log(20.0)] * 20]
    assert spread_of(delayed) == pytest.approx(sigma, rel=0.1)
    assert spread_of(independent[: MIN_CYCLES - 1]) == 0.0
    assert lag_correlation([0.1, 0.1, 0.1]) == 0.0
    # two nodes, one 20% slower than the other all along: not step-to-step spread; the
    # median is over both
    fast, slow = list(sigma * z[:1000]), list(sigma * z[1000:] + math.log(1.2))
    fit = fit_spread([fast, slow])
    assert fit.sigma == pytest.approx(sigma, rel=0.1)
    assert fit.scale == pytest.approx(math.exp(np.median(fast + slow)), rel=1e-12)
    assert abs(fit.lag) < 0.1
    assert fit_spread([]) == fit_spread([[]])  # nothing measured: no spread, scale 1
    assert (fit_spread([]).scale, fit_spread([]).sigma) == (1.0, 0.0)


def test_a_node_s_other_threads_cpu_is_fitted_per_step_and_token():
    # a decode node's cycles: the engine thread's CPU (runner + 0.3 ms + 0.07 ms/seq) and
    # the HTTP thread's streaming (0.2 ms + 0.1 ms per token sampled) in the process's
    engine, stream = (3e-4, 7e-5), (2e-4, 1e-4)
    records = []
    for step in random_steps(5, MIN_CYCLES):
        runner = 1e-3 * step.num_seqs
        thread = runner + engine[0] + engine[1] * step.num_seqs
        record = log_record(step, runner, thread + stream[0] + stream[1] * step.num_sampled)
        records.append({**record, "cycle_thread_cpu_s": thread})
    assert fit_other_threads(records) == pytest.approx(stream, rel=1e-6)
    assert fit_host_overhead(records, clock="cycle_thread_cpu_s") == pytest.approx(engine)
    # a log from before thread clocks, or too few cycles: nothing to split
    assert fit_other_threads([{**r, "cycle_thread_cpu_s": None} for r in records]) == (0, 0)
    assert fit_other_threads(records[: MIN_CYCLES - 1]) == (0.0, 0.0)


def test_a_node_with_few_cycles_shares_its_process_cpu_beyond_the_runner_over_its_steps():
    steps = list(random_steps(3, 4))
    records = [log_record(step, 0.01 * (i + 1), None) for i, step in enumerate(steps)]
    runner = sum(r["execute_cpu_s"] for r in records)  # 0.1 s over four steps
    assert mean_host_overhead(records, runner + 0.02) == pytest.approx(0.005)
    assert mean_host_overhead(records, runner / 2) == 0.0  # clock ticks round the process's
    assert mean_host_overhead([], 1.0) == 0.0
    # too few cycles: the process's share; enough: the cycles' fit, even where it is zero
    assert fit_role_overhead(records, runner + 0.02) == (pytest.approx(0.005), 0.0)
    shape, truth = SHAPES["llama-3-8b"], cpu_truth()
    model = StepTimeModel(shape, truth)
    cycled = [
        log_record(step, model.step_time(step), model.step_time(step))
        for step in random_steps(4, MIN_CYCLES)
    ]
    assert fit_role_overhead(cycled, 1e3) == pytest.approx((0.0, 0.0), abs=1e-9)


def test_a_node_s_loop_work_after_its_steps_is_the_mean_of_the_measured_tails():
    records = [
        {"tail_thread_cpu_s": 0.002}, {"tail_thread_cpu_s": 0.001},
        {"tail_thread_cpu_s": None}, {},  # not followed yet; a log from before tails
    ]  # fmt: skip
    assert mean_tail(records) == pytest.approx(0.0015)
    assert mean_tail(records[2:]) is None


def test_an_engine_thread_runs_its_runner_cpu_over_the_stretches_it_ran_in():
    # 4 ms in four stretches (three switches) and 2 ms in one; a record without switch
    # counts (another system) is left out, and a log of only those gives 0 (not measured)
    records = [
        {"execute_cpu_s": 0.004, "execute_switches": 3},
        {"execute_cpu_s": 0.002, "execute_switches": 0},
        {"execute_cpu_s": 0.010, "execute_switches": None},
    ]
    assert engine_run_length(records) == pytest.approx(0.006 / 5)
    assert engine_run_length(records[2:]) == 0.0
    # with enough measured cycles, the engine thread's CPU and switches over its cycles
    cycles = [
        {**records[0], "cycle_thread_cpu_s": 0.005, "cycle_switches": 4} for _ in range(MIN_CYCLES)
    ]
    assert engine_run_length(cycles + records) == pytest.approx(0.005 / 5)
    # one cycle short: back to the runner alone, over every record that counted switches
    runner_cpu, runs = (MIN_CYCLES - 1) * 0.004 + 0.006, (MIN_CYCLES - 1) * 4 + 5
    assert engine_run_length(cycles[1:] + records) == pytest.approx(runner_cpu / runs)
