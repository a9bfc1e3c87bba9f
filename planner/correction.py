"""The planner's step model corrected from what the routers measure (`StepCorrection`).

The device profile says how long a step takes; the live deployment says how long it does.
After each interval the planner compares the current layout's simulated TPOT and TTFT
medians with the measured ones and moves the profile's decode and prefill step scales
(`DeviceProfile.decode_step_scale`, `prefill_step_scale`: every step's model time times
the scale) part of the way towards the measured ratio, in log space: a scale `s` becomes
`s * (measured / predicted) ** weight`, within `[1 / MAX_SCALE, MAX_SCALE]`. TPOT moves
the decode steps, TTFT the prefill ones (TTFT holds queueing too: the planner corrects
only on an interval whose measured attainment is met, when queues are short). The
disagreements are the planner's `tandem_planner_prediction_error_ratio` metric.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from tandem.sim.profiles import DeviceProfile

MAX_SCALE = 20.0


@dataclass
class StepCorrection:
    weight: float = 0.5
    scales: dict[str, float] = field(default_factory=lambda: {"decode": 1.0, "prefill": 1.0})
    # the last disagreement per metric: measured / predicted - 1
    errors: dict[str, float] = field(default_factory=dict)

    def observe(
        self, metric: str, measured: float | None, predicted: float | None, learn: bool = True
    ) -> None:
        """One interval's `metric` ("tpot" or "ttft") median, measured and simulated with the
        current correction; `learn`: move the scale (else only record the disagreement)."""
        if not measured or not predicted or measured <= 0 or predicted <= 0:
            return
        ratio = measured / predicted
        self.errors[metric] = ratio - 1.0
        if learn:
            role = {"tpot": "decode", "ttft": "prefill"}[metric]
            scale = self.scales[role] * ratio**self.weight
            self.scales[role] = min(MAX_SCALE, max(1.0 / MAX_SCALE, scale))

    def apply(self, profile: DeviceProfile) -> DeviceProfile:
        """`profile` with its step scales multiplied by the learnt ones."""
        return replace(
            profile,
            decode_step_scale=profile.decode_step_scale * self.scales["decode"],
            prefill_step_scale=profile.prefill_step_scale * self.scales["prefill"],
        )

    @property
    def corrected(self) -> bool:
        return any(not math.isclose(s, 1.0) for s in self.scales.values())
