"""Fit a device profile's constants from measured step times.

Each sample is a step's shape and its measured seconds. The model of a CPU step is
`overhead + seq_cost * num_seqs + flops / F + attention_flops / A + bytes / B` (no
overlap: one core computes and waits for memory in turn; `flops` here the products with
the weights, `attention_flops` attention's scores and sums, which reach a rate of their
own: `attention_efficiency` = A / F), linear in (overhead, seq_cost, 1/F, 1/A, 1/B); the
fit is least squares of the relative error (a 2 ms decode step counts as much as a 500 ms
prefill: both latencies matter) with every coefficient kept non-negative (a coefficient
that would go negative is dropped and the rest refitted).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from tandem.engine.telemetry.step_log import StepWork
from tandem.sim.profiles import DeviceProfile
from tandem.sim.shapes import ModelShape
from tandem.sim.step_model import StepShape, StepTimeModel

# Fewer measured cycles than this: no host overhead is fitted (too few to split a constant
# from a per-sequence cost); that CPU counts as the host's background instead.
MIN_CYCLES = 20

# What a dropped 1/F, 1/A or 1/B term becomes: a rate so high its term vanishes.
UNBOUNDED_RATE = 1e18


@dataclasses.dataclass(frozen=True)
class Fit:
    profile: DeviceProfile
    median_rel_error: float  # |predicted - measured| / measured over the samples
    num_samples: int


def nonnegative_lstsq(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """argmin |a x - y| with x >= 0, by dropping the most negative column until none is."""
    active = list(range(a.shape[1]))
    x = np.zeros(a.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(a[:, active], y, rcond=None)
        if (sol >= 0).all():
            x[active] = sol
            return x
        active.pop(int(np.argmin(sol)))
    return x


def fit_profile(
    samples: Sequence[tuple[StepShape, float]], shape: ModelShape, base: DeviceProfile
) -> Fit:
    """`base` with its step constants fitted to `samples` (and overlap off, compute and
    bandwidth efficiencies 1)."""
    if len(samples) < 5:
        raise ValueError(f"need at least 5 step samples to fit 5 constants, got {len(samples)}")
    unit = dataclasses.replace(base, compute_efficiency=1.0, bandwidth_efficiency=1.0)
    model = StepTimeModel(shape, unit)
    rows = []
    for step, _ in samples:
        cost = model.cost(step)
        weights = cost.flops - cost.attention_flops
        rows.append([1.0, step.num_seqs, weights, cost.attention_flops, cost.bytes])
    a = np.asarray(rows)
    y = np.asarray([t for _, t in samples])
    a, y = a / y[:, None], np.ones_like(y)  # relative error: each row divided by its time
    scale = a.max(axis=0)  # columns of very different magnitudes: fit in units of their max
    x = nonnegative_lstsq(a / scale, y) / scale
    peak = float(1 / x[2]) if x[2] > 0 else UNBOUNDED_RATE
    profile = dataclasses.replace(
        unit,
        step_overhead_s=float(x[0]),
        seq_overhead_s=float(x[1]),
        peak_flops=peak,
        attention_efficiency=float(1 / x[3] / peak) if x[3] > 0 else UNBOUNDED_RATE,
        mem_bandwidth=float(1 / x[4]) if x[4] > 0 else UNBOUNDED_RATE,
        overlap=False,
    )
    check = StepTimeModel(shape, profile)
    errors = [abs(check.step_time(s) - t) / t for s, t in samples]
    return Fit(profile, float(np.median(errors)), len(samples))


def logged_step(record: Mapping[str, float]) -> StepShape:
    """A step of a node's step log (`GET /debug/steps`) as the step-time model sees it."""
    work = StepWork(
        int(record["num_seqs"]),
        int(record["num_tokens"]),
        int(record["num_context_tokens"]),
        int(record["num_attention_pairs"]),
    )
    return StepShape(work, int(record["num_sampled"]))


def fit_logged_profile(
    records: Sequence[Mapping[str, float]], shape: ModelShape, base: DeviceProfile
) -> Fit:
    """`fit_profile` on the model runner's own CPU time of logged steps: the engine as it
    ran inside the deployment, beside the others, rather than alone."""
    return fit_profile([(logged_step(r), r["execute_cpu_s"]) for r in records], shape, base)


def step_residuals(
    records: Sequence[Mapping[str, float]], shape: ModelShape, profile: DeviceProfile
) -> list[float]:
    """Per logged step (in the log's order), the logarithm of the model runner's CPU over
    what `profile` models for it (`StepTimeModel.runner_time`: no host work)."""
    model = StepTimeModel(shape, profile)
    return [math.log(r["execute_cpu_s"] / model.runner_time(logged_step(r))) for r in records]


def spread_of(residuals: Sequence[float]) -> float:
    """The standard deviation of log-residuals, robustly: half the distance between their
    16th and 84th percentiles (one standard deviation each side for a normal
    distribution), so that a few steps the host delayed do not set it; 0 with fewer than
    `MIN_CYCLES` residuals."""
    if len(residuals) < MIN_CYCLES:
        return 0.0
    low, high = np.percentile(residuals, [16, 84])
    return float(high - low) / 2


def lag_correlation(residuals: Sequence[float]) -> float:
    """The correlation of each residual with the next (one node's steps in order): near
    0 where the steps vary independently, near 1 where slow steps come in long spells;
    0 with fewer than three or no spread."""
    x = np.asarray(residuals, dtype=float)
    if len(x) < 3 or x[:-1].std() == 0 or x[1:].std() == 0:
        return 0.0
    return float(np.corrcoef(x[:-1], x[1:])[0, 1])


@dataclasses.dataclass(frozen=True)
class Spread:
    """A role's steps around the model (`sim/step_spread.py`)."""

    scale: float  # the median of the runner's time over the model
    sigma: float  # the standard deviation of its logarithm, from step to step on a node
    lag: float  # the correlation of a step's log-residual with the next one's on its node


def fit_spread(per_node: Sequence[Sequence[float]]) -> Spread:
    """From each node's log-residuals (`step_residuals`, in its log's order): the median
    of all of them; their spread within nodes (each node's less its own median, pooled, so
    that a node that runs faster than another all along is not counted as spread); the
    mean over the nodes of their lag-1 correlation."""
    pooled = [x for xs in per_node for x in xs]
    if not pooled:
        return Spread(1.0, 0.0, 0.0)
    centred = [x - float(np.median(xs)) for xs in per_node for x in xs]
    lags = [lag_correlation(xs) for xs in per_node if len(xs) >= 3]
    lag = sum(lags) / len(lags) if lags else 0.0
    return Spread(math.exp(float(np.median(pooled))), spread_of(centred), lag)


def fit_host_overhead(
    records: Sequence[Mapping[str, float]], clock: str = "cycle_cpu_s"
) -> tuple[float, float]:
    """(per step, per sequence) CPU seconds a node spent outside the model runner, from its
    logged steps' measured cycles (the process's CPU from one step's start to the next, less
    the runner's; with `clock` "cycle_thread_cpu_s" the engine thread's alone); (0, 0) with
    fewer than `MIN_CYCLES` cycles."""
    return _fit_cycles(records, (clock,), "num_seqs", lambda r: r[clock] - r["execute_cpu_s"])


def fit_other_threads(records: Sequence[Mapping[str, float]]) -> tuple[float, float]:
    """(per step, per token sampled) CPU seconds a node's threads other than its engine's
    spent over its measured cycles: the process's CPU less the engine thread's. On a decode
    node mostly its HTTP thread streaming the step's records (and the transfer library's
    threads); (0, 0) with fewer than `MIN_CYCLES` cycles that measured both."""
    clocks = ("cycle_cpu_s", "cycle_thread_cpu_s")
    return _fit_cycles(records, clocks, "num_sampled", lambda r: r[clocks[0]] - r[clocks[1]])


def _fit_cycles(
    records: Sequence[Mapping[str, float]],
    clocks: tuple[str, ...],
    per: str,
    spent: Callable[[Mapping[str, float]], float],
) -> tuple[float, float]:
    """`spent` over the cycles that measured `clocks`, fitted as a constant plus a cost per
    unit of `per` (both non-negative); (0, 0) with fewer than `MIN_CYCLES` cycles."""
    cycles = [r for r in records if all(r.get(c) is not None for c in clocks)]
    if len(cycles) < MIN_CYCLES:
        return 0.0, 0.0
    a = np.asarray([[1.0, r[per]] for r in cycles])
    y = np.asarray([spent(r) for r in cycles])
    constant, each = nonnegative_lstsq(a, y)
    return float(constant), float(each)


def mean_host_overhead(records: Sequence[Mapping[str, float]], process_cpu_s: float) -> float:
    """Per step, the CPU seconds a node's process spent outside the model runner over the
    steps `records` logged: its whole CPU over the slice (`process_cpu_s`) less the runner's,
    shared out over the steps. For a node whose steps seldom run back to back (a prefill
    worker, whose loop waits for writes after most steps), where `fit_host_overhead` has
    too few cycles: it also counts the loop's polling between steps (1 ms polls while
    writes are in flight), which runs around the steps rather than in them."""
    if not records:
        return 0.0
    runner = sum(r["execute_cpu_s"] for r in records)
    return max(0.0, process_cpu_s - runner) / len(records)


def fit_role_overhead(
    records: Sequence[Mapping[str, float]], process_cpu_s: float
) -> tuple[float, float]:
    """A node's (per step, per sequence) work outside the runner: fitted on its cycles
    (`fit_host_overhead`) where it has `MIN_CYCLES`, else its process's CPU beyond the
    runner per step (`mean_host_overhead`) and nothing per sequence."""
    if sum(1 for r in records if r.get("cycle_cpu_s") is not None) >= MIN_CYCLES:
        return fit_host_overhead(records)
    return mean_host_overhead(records, process_cpu_s), 0.0


def mean_tail(records: Sequence[Mapping[str, float]]) -> float | None:
    """A node's mean loop work on the engine thread after each step's runner, up to its
    next wait or step (`tail_thread_cpu_s`); None where no step measured one. For a prefill
    worker, the part of `mean_host_overhead` that runs in line with its steps."""
    tails = [r["tail_thread_cpu_s"] for r in records if r.get("tail_thread_cpu_s") is not None]
    return sum(tails) / len(tails) if tails else None


def engine_run_length(records: Sequence[Mapping[str, float]]) -> float:
    """How long a node's engine thread runs before it leaves its core, on average: its CPU
    over the stretches it ran in (one, and one more per context switch). Over its measured
    cycles (`cycle_thread_cpu_s`, `cycle_switches`: the step and the loop's work up to the
    next step, where it also waits for the interpreter lock while the HTTP thread streams
    the step's records) where it has `MIN_CYCLES`, else inside the runner alone
    (`execute_cpu_s`, `execute_switches`); 0 where the log has no switch counts."""
    cycles = [r for r in records if r.get("cycle_switches") is not None]
    if len(cycles) >= MIN_CYCLES:
        return _mean_run(cycles, "cycle_thread_cpu_s", "cycle_switches")
    counted = [r for r in records if r.get("execute_switches") is not None]
    return _mean_run(counted, "execute_cpu_s", "execute_switches") if counted else 0.0


def _mean_run(records: Sequence[Mapping[str, float]], cpu: str, switches: str) -> float:
    """CPU over the stretches run: one per record, and one more per switch in it."""
    return sum(r[cpu] for r in records) / sum(1 + r[switches] for r in records)
