"""The cheapest prefill:decode replica counts that meet the SLOs (`LayoutSearch`), within
each pool's bounds and at one remote-prefill threshold, with the pools' TP sizes and the
rest of the deployment fixed.

`tandem plan` tries every layout of every device count; the planner must answer within
seconds, every interval, so it prunes (docs/autoscaling.md):

- **bisection on decode replicas**: for a prefill count, the fewest decode replicas that
  meet the SLOs, assuming that more replicas never meet them less (`log2` simulations, not
  one per count);
- **the last answer bounds the next**: more prefill replicas never need more decode ones,
  so each prefill count's bisection searches below the previous count's answer;
- **cost bounds**: prefill counts stop where even the fewest decode replicas cost more
  than the best layout found;
- **losers stop early**: a simulation ends as soon as its SLOs are lost (`SLOWatch`);
- **memo**: a layout is simulated once per search;
- **a ceiling on devices**: the search at another threshold looks only for layouts cheaper
  than the best found at the running one (`max_devices`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from tandem.sim.cluster import ClusterConfig
from tandem.sim.plan import materialized
from tandem.sim.profiles import DeviceProfile
from tandem.sim.results import SLO
from tandem.sim.shapes import ModelShape
from tandem.sim.simulate import simulate
from tandem.sim.workload import SimRequest


@dataclass(frozen=True)
class Bounds:
    min_replicas: int
    max_replicas: int

    def __post_init__(self) -> None:
        if not 0 <= self.min_replicas <= self.max_replicas:
            raise ValueError(f"bounds need 0 <= min <= max, got {self}")


@dataclass(frozen=True)
class Layout:
    """Replicas per pool, and the decode pool's remote-prefill threshold (prompt tokens)."""

    prefill: int
    decode: int
    threshold: int = 0


@dataclass(frozen=True)
class Prediction:
    """One layout simulated on the workload. `attained`: the share of finished requests
    within both targets (of those seen, when the run stopped early); `meets`: every request
    finished and at least the wanted share attained."""

    layout: Layout
    devices: int
    meets: bool
    attained: float | None = None
    ttft_p50_s: float | None = None
    tpot_p50_s: float | None = None


class LayoutSearch:
    def __init__(
        self,
        base: ClusterConfig,
        shape: ModelShape,
        profile: DeviceProfile,
        requests: Sequence[SimRequest],
        slo: SLO,
        attainment: float,
    ) -> None:
        self.base, self.shape, self.profile = base, shape, profile
        self.requests = materialized(requests)
        self.slo, self.attainment = slo, attainment
        self.simulations = 0
        self.seconds = 0.0
        self._memo: dict[Layout, tuple[Prediction, bool]] = {}  # -> (it, run to the end)

    def predict(self, layout: Layout, whole: bool = False) -> Prediction:
        """The layout simulated (memoized); `whole`: run to the end even when its SLOs are
        lost, for its figures."""
        known = self._memo.get(layout)
        if known is not None and (known[1] or not whole):
            return known[0]
        self._memo[layout] = self._simulate(layout, whole)
        return self._memo[layout][0]

    def cheapest(
        self,
        prefill: Bounds,
        decode: Bounds,
        threshold: int | None = None,
        max_devices: int | None = None,
    ) -> Prediction | None:
        """The layout within the bounds, at `threshold` (the base's by default) and on at
        most `max_devices`, that meets the SLOs on the fewest devices (the higher attainment
        between equals); None when even the largest does not."""
        t = self.base.remote_prefill_threshold if threshold is None else threshold
        best: Prediction | None = None
        ceiling = decode.max_replicas
        for p in range(prefill.min_replicas, prefill.max_replicas + 1):
            cheapest = self._devices(Layout(p, decode.min_replicas))
            if best is not None and cheapest > best.devices:
                break
            if max_devices is not None:
                if cheapest > max_devices:
                    break
                ceiling = min(
                    ceiling, (max_devices - p * self.base.tp_prefill) // self.base.tp_decode
                )
            d = self._fewest_decode(p, t, decode.min_replicas, ceiling)
            if d is None:
                continue
            ceiling = d
            found = self.predict(Layout(p, d, t))
            if best is None or (found.devices, -(found.attained or 0)) < (
                best.devices,
                -(best.attained or 0),
            ):
                best = found
        return best

    def _fewest_decode(self, p: int, t: int, lo: int, hi: int) -> int | None:
        lo = max(lo, 1)
        if hi < lo or not self.predict(Layout(p, hi, t)).meets:
            return None
        while lo < hi:
            mid = (lo + hi) // 2
            if self.predict(Layout(p, mid, t)).meets:
                hi = mid
            else:
                lo = mid + 1
        return hi

    def _devices(self, layout: Layout) -> int:
        return layout.prefill * self.base.tp_prefill + layout.decode * self.base.tp_decode

    def _simulate(self, layout: Layout, whole: bool) -> tuple[Prediction, bool]:
        start = time.perf_counter()
        self.simulations += 1
        try:
            config = replace(
                self.base, num_prefill=layout.prefill, num_decode=layout.decode,
                remote_prefill_threshold=layout.threshold,
            )  # fmt: skip
            s = simulate(
                config, self.shape, self.profile, self.requests, self.slo,
                attainment=None if whole else self.attainment,
            )  # fmt: skip
        except ValueError:  # no decode node, or the model does not fit the devices
            return Prediction(layout, self._devices(layout), False), True
        finally:
            self.seconds += time.perf_counter() - start
        finished = s["num_finished"] == s["num_requests"] and not s["stopped_early"]
        attained = s["slo"]["attained"]
        prediction = Prediction(
            layout, self._devices(layout), finished and attained >= self.attainment,
            attained, s["ttft_s"]["p50"], s["tpot_s"]["p50"],
        )  # fmt: skip
        return prediction, not s["stopped_early"]
