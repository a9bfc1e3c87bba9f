"""A role's steps spread around the step-time model: factors of mean one drawn from the
cluster's seed, nothing drawn where the profile gives no spread, and a simulation that
varies its prompt steps by the profile and nothing else."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from tandem.sim.cluster import Cluster, ClusterConfig
from tandem.sim.profiles import load_profile
from tandem.sim.shapes import SHAPES
from tandem.sim.step_spread import StepSpread
from tandem.sim.workload import SimRequest

SIGMA = 0.2
DRAWS = 20_000


def test_factors_have_mean_one_and_the_spread_asked_for():
    spread = StepSpread(seed=5)
    factors = np.array([spread.factor(SIGMA) for _ in range(DRAWS)])
    # the mean of DRAWS factors of standard deviation ~SIGMA: within 4 standard errors
    assert factors.mean() == pytest.approx(1.0, abs=4 * SIGMA / math.sqrt(DRAWS))
    # the standard deviation of a normal sample's: ~ SIGMA / sqrt(2 DRAWS)
    assert np.log(factors).std() == pytest.approx(SIGMA, abs=4 * SIGMA / math.sqrt(2 * DRAWS))


def test_the_same_seed_draws_the_same_factors_and_no_spread_draws_nothing():
    one, two, other = StepSpread(seed=1), StepSpread(seed=1), StepSpread(seed=2)
    first = [one.factor(SIGMA) for _ in range(5)]
    assert first == [two.factor(SIGMA) for _ in range(5)]
    assert first != [other.factor(SIGMA) for _ in range(5)]
    assert two.factor(0.0) == 1.0  # and draws nothing: the two stay in step
    assert one.factor(SIGMA) == two.factor(SIGMA)


def isolated_prompts(count: int) -> list[SimRequest]:
    """The same prompt length again and again, far apart: alone on every node."""
    return [SimRequest.of_tokens(f"r{i}", 2.0 * i, [3 + i] * 256, 4) for i in range(count)]


def run(prefill_spread: float, seed: int = 0) -> list:
    shape = SHAPES["llama-3-8b"]
    profile = dataclasses.replace(load_profile("h100"), prefill_step_spread=prefill_spread)
    config = ClusterConfig(num_prefill=1, num_decode=1, num_kv_blocks=64, max_model_len=1024)
    cluster = Cluster(config, shape, profile, seed=seed)
    records = cluster.run(isolated_prompts(30))
    cluster.check_integrity()
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
