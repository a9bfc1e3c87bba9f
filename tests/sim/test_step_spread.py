"""A role's steps around the step-time model: factors of the asked median and spread, drawn
from the cluster's seed, nothing drawn where the profile gives no spread, and a simulation
that varies its prompt steps by the profile and nothing else."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from tandem.sim.cluster import ClusterConfig
from tandem.sim.profiles import load_profile
from tandem.sim.shapes import SHAPES
from tandem.sim.simulate import run_cluster
from tandem.sim.step_spread import StepSpread
from tandem.sim.workload import SimRequest

SIGMA = 0.2
DRAWS = 20_000


def test_factors_have_the_median_and_the_spread_asked_for():
    spread = StepSpread(seed=5)
    logs = np.log([spread.factor(1.1, SIGMA) for _ in range(DRAWS)])
    # a normal sample's mean and standard deviation: within 4 standard errors
    assert logs.mean() == pytest.approx(math.log(1.1), abs=4 * SIGMA / math.sqrt(DRAWS))
    assert logs.std() == pytest.approx(SIGMA, abs=4 * SIGMA / math.sqrt(2 * DRAWS))


def test_the_same_seed_draws_the_same_factors_and_no_spread_draws_nothing():
    one, two, other = StepSpread(seed=1), StepSpread(seed=1), StepSpread(seed=2)
    first = [one.factor(1.0, SIGMA) for _ in range(5)]
    assert first == [two.factor(1.0, SIGMA) for _ in range(5)]
    assert first != [other.factor(1.0, SIGMA) for _ in range(5)]
    assert two.factor(1.3, 0.0) == 1.3  # and draws nothing: the two stay in step
    assert one.factor(1.0, SIGMA) == two.factor(1.0, SIGMA)


def isolated_prompts(count: int) -> list[SimRequest]:
    """The same prompt length again and again, far apart: alone on every node."""
    return [SimRequest.of_tokens(f"r{i}", 2.0 * i, [3 + i] * 256, 4) for i in range(count)]


def run(spread: float, scale: float = 1.0, seed: int = 0) -> list:
    shape = SHAPES["llama-3-8b"]
    profile = dataclasses.replace(
        load_profile("h100"), prefill_step_spread=spread, prefill_step_scale=scale
    )
    config = ClusterConfig(num_prefill=1, num_decode=1, num_kv_blocks=64, max_model_len=1024)
    _, records = run_cluster(config, shape, profile, isolated_prompts(30), seed=seed)
    return records


def phase(records: list, name: str) -> list[float]:
    """Each request's time in one of the router's phases (`remote_prefill`: the prefill
    worker's, from taking the prompt to its first token: here its one step)."""
    return [r.phases[name] for r in records]


def test_a_prefill_spread_varies_the_prompt_steps_and_nothing_else():
    exact, spread = run(0.0), run(SIGMA)
    steps = phase(exact, "remote_prefill")
    assert max(steps) - min(steps) < 1e-12  # the same step every time
    varied = np.log(np.array(phase(spread, "remote_prefill")) / steps[0])
    assert varied.std() > SIGMA / 4  # 30 draws: their spread is far from nothing
    for name in ("first_decode", "decode"):  # the decode steps keep the model's time
        assert phase(spread, name) == pytest.approx(phase(exact, name), abs=1e-12)
    assert phase(run(SIGMA), "remote_prefill") == phase(spread, "remote_prefill")  # the seed's
    assert phase(run(SIGMA, seed=1), "remote_prefill") != phase(spread, "remote_prefill")


def test_a_prefill_scale_lengthens_every_prompt_step_alike():
    exact, scaled = phase(run(0.0), "remote_prefill"), phase(run(0.0, scale=1.5), "remote_prefill")
    # the whole step is the runner's on this profile (no host work): 1.5 times as long
    assert scaled == pytest.approx([1.5 * s for s in exact], rel=1e-9)
