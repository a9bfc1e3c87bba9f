"""How much a node's steps vary around the step-time model: a factor on each step's model
runner time, log-normal, fitted to the runner's measured time over the model.

A CPU engine's prompt steps take their modelled time only on the whole: the runner's CPU
for steps of one shape spreads by about 15% (the standard deviation of its logarithm),
with nothing to tell one step from the next (bench/sim_validate.py measures both). Waiting
behind a step in progress takes longer the more the steps vary (a request that arrives at a
random moment is more likely to land in a long one), so a model that gives every step its
typical time shortens the waits, and the tails of the time to first token most. The
factor's median is measured too: the fit that makes the model weighs every step's relative
error alike, which leaves its prediction a little off the steps' median. Factors are drawn
per step from the cluster's own generator, so a simulation with a given seed is the same
every time.
"""

from __future__ import annotations

import math
import random


class StepSpread:
    """Draws step-time factors: `scale` exp(sigma z), z standard normal."""

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)

    def factor(self, scale: float, sigma: float) -> float:
        """One step's factor, of median `scale` and log standard deviation `sigma` (exactly
        `scale` when `sigma` is 0: nothing drawn)."""
        if sigma <= 0.0:
            return scale
        return scale * math.exp(sigma * self._rng.gauss(0.0, 1.0))
