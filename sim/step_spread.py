"""How much a node's steps vary around the step-time model: a factor on each step's model
runner time, log-normal with mean one.

A CPU engine's prompt steps take their modelled time only on the mean: the runner's CPU of
same-shaped steps spreads by about 15% (its logarithm's standard deviation), with nothing
to tell one step from the next (bench/sim_validate.py measures both). Waiting behind a
step in progress takes longer the more the steps vary (a request that arrives at a random
moment is more likely to land in a long one), so a model that times every step exactly
its mean shortens the waits, and the tails of the time to first token most. The factor is
drawn per step from the cluster's own generator, so a simulation with a given seed is the
same every time.
"""

from __future__ import annotations

import math
import random


class StepSpread:
    """Draws step-time factors: exp(sigma z - sigma^2 / 2), z standard normal (mean one)."""

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)

    def factor(self, sigma: float) -> float:
        """One step's factor for a spread `sigma` (exactly 1 when it is 0: nothing drawn)."""
        if sigma <= 0.0:
            return 1.0
        return math.exp(sigma * self._rng.gauss(0.0, 1.0) - sigma * sigma / 2)
