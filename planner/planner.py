"""One planning step (`Planner.decide`): the routers' traffic of the last interval in, the
replica counts to set out, with the reason and the figures behind it (`Decision`).

    traffic -> a workload like it (`observed_workload`)
            -> the current layout simulated; the step model corrected by what was measured
            -> the cheapest layout within the bounds that meets the SLOs (`LayoutSearch`),
               at the running remote-prefill threshold, then only cheaper ones at each
               other threshold the settings allow
            -> never below the current layout while the routers measure the target missed,
               and a pod more for each missed target where the simulator disagrees
            -> stabilized (`Stabilizer`): up at once, down after the window; another
               threshold once it has been planned for a whole window

With too few finished requests to model (an idle deployment), the plan is each pool's
minimum, which the stabilizer reaches only once the window has been idle throughout.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from tandem.planner.correction import StepCorrection
from tandem.planner.layout_search import Bounds, Layout, LayoutSearch, Prediction
from tandem.planner.stabilizer import Stabilizer
from tandem.planner.traffic import TPOT, TTFT, TrafficWindow
from tandem.planner.workload import observed_workload
from tandem.sim.cluster import ClusterConfig
from tandem.sim.profiles import DeviceProfile
from tandem.sim.results import SLO
from tandem.sim.shapes import ModelShape
from tandem.sim.workload import SimRequest


@dataclass(frozen=True)
class PlannerSettings:
    """`base`: the deployment as it runs (TP sizes, threshold, engine limits); its replica
    counts are the planner's to choose. The simulated workload spans `horizon_s` of the
    measured rate, at least `num_requests` and at most `max_requests` requests (a span
    short of that fills no batch and builds no queue: the simulated day of
    docs/autoscaling.md). `min_finished`: fewer finished requests in an interval plan the
    minimum. `thresholds`: the remote-prefill thresholds it may choose besides the running
    one (none: it keeps the running one)."""

    slo: SLO
    attainment: float
    prefill: Bounds
    decode: Bounds
    base: ClusterConfig
    shape: ModelShape
    profile: DeviceProfile
    num_requests: int = 200
    horizon_s: float = 60.0
    max_requests: int = 2000
    min_finished: int = 10
    seed: int = 0
    thresholds: tuple[int, ...] = ()

    def workload_size(self, rate_rps: float) -> int:
        """Requests in the simulated workload at `rate_rps`."""
        spanned = math.ceil(rate_rps * self.horizon_s)
        return min(self.max_requests, max(self.num_requests, spanned))


@dataclass(frozen=True)
class Decision:
    current: Layout
    planned: Layout  # the search's answer (each pool's maximum when nothing meets)
    target: Layout  # what to set now, after stabilization
    reason: str
    predicted_attainment: float | None  # of `planned`, on the modelled workload
    measured_attainment: float | None  # the interval's, from the routers
    current_attainment: float | None  # the current layout's, simulated
    rate_rps: float
    search_s: float
    simulations: int
    errors: dict[str, float] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return self.target != self.current

    def as_status(self) -> dict[str, Any]:
        """The decision as the resource's `status.planner` shows it; a figure it does not
        have is left out (the schema's numbers take no null)."""
        status = {
            "prefill": {"current": self.current.prefill, "desired": self.target.prefill},
            "decode": {"current": self.current.decode, "desired": self.target.decode},
            "predictedAttainment": _rounded(self.predicted_attainment),
            "measuredAttainment": _rounded(self.measured_attainment),
            "requestRate": round(self.rate_rps, 3),
            "reason": self.reason,
            "searchSeconds": round(self.search_s, 3),
        }
        return {key: value for key, value in status.items() if value is not None}


class Planner:
    def __init__(
        self,
        settings: PlannerSettings,
        stabilizer: Stabilizer | None = None,
        correction: StepCorrection | None = None,
    ) -> None:
        self.settings = settings
        self.stabilizer = stabilizer or Stabilizer()
        self.correction = correction or StepCorrection()

    def decide(self, now_s: float, current: Layout, traffic: TrafficWindow) -> Decision:
        s = self.settings
        start = time.perf_counter()
        measured = traffic.attainment(s.slo.ttft_s, s.slo.tpot_s)
        if traffic.finished < s.min_finished:
            planned = Layout(s.prefill.min_replicas, s.decode.min_replicas, current.threshold)
            target = self.stabilizer.settle(now_s, current, planned)
            idle = (f"{traffic.finished:.0f} requests finished in the interval (fewer than "
                    f"{s.min_finished}): planned the minimum {self._layout(planned)}")  # fmt: skip
            why = self._outcome(idle, current, target, planned)
            return Decision(current, planned, target, why, None, measured, None,
                            traffic.rate_rps, time.perf_counter() - start, 0)  # fmt: skip
        size = s.workload_size(traffic.rate_rps)
        requests = observed_workload(traffic, size, s.shape.vocab_size, s.seed)
        now = self._search(requests).predict(current, whole=True)
        learn = measured is not None and measured >= s.attainment
        self.correction.observe(
            "tpot", traffic.histograms[TPOT].quantile(0.5), now.tpot_p50_s, learn
        )
        self.correction.observe(
            "ttft", traffic.histograms[TTFT].quantile(0.5), now.ttft_p50_s, learn
        )
        search = self._search(requests)
        best = self._cheapest(search, current.threshold)
        top = Layout(s.prefill.max_replicas, s.decode.max_replicas, current.threshold)
        planned = best.layout if best else top
        why = self._reason(best, planned, s.attainment)
        if measured is not None and measured < s.attainment:
            floor, said = self._measured_floor(traffic, current, now.meets)
            lifted = Layout(max(planned.prefill, floor.prefill),
                            max(planned.decode, floor.decode), planned.threshold)  # fmt: skip
            if lifted != planned:
                planned, why = lifted, f"{why}; the routers measured {measured:.0%}: {said}"
        target = self.stabilizer.settle(now_s, current, planned)
        return Decision(
            current, planned, target, self._outcome(why, current, target, planned),
            best.attained if best else None, measured, now.attained, traffic.rate_rps,
            time.perf_counter() - start, search.simulations + 1, dict(self.correction.errors),
        )  # fmt: skip

    def _search(self, requests: list[SimRequest]) -> LayoutSearch:
        s = self.settings
        profile = self.correction.apply(s.profile)
        return LayoutSearch(s.base, s.shape, profile, requests, s.slo, s.attainment)

    def _measured_floor(
        self, traffic: TrafficWindow, current: Layout, model_meets: bool
    ) -> tuple[Layout, str]:
        """The least to plan while the routers measure the target missed: no pool below its
        current size, whatever the simulator says; and where the simulator calls the current
        layout fine (its model is optimistic at this load), one pod more in the pool of
        each target missed, within the bounds: prefill for TTFT (decode where prefill
        cannot grow), decode for TPOT."""
        s = self.settings
        if not model_meets:
            return current, "no scale-down"
        missed = {
            name: share is not None and share < s.attainment
            for name, share in (
                ("ttft", traffic.histograms[TTFT].share_at_most(s.slo.ttft_s)),
                ("tpot", traffic.histograms[TPOT].share_at_most(s.slo.tpot_s)),
            )
        }
        prefill, decode = current.prefill, current.decode
        if missed["ttft"] and prefill < s.prefill.max_replicas:
            prefill += 1
        elif missed["ttft"]:
            decode += 1
        if missed["tpot"]:
            decode += 1
        floor = Layout(prefill, min(decode, s.decode.max_replicas), current.threshold)
        which = " and ".join(name.upper() for name, miss in missed.items() if miss)
        fine = f"the simulator calls {self._layout(current)} fine"
        return floor, f"{fine}; {which} missed: at least {self._layout(floor)}"

    def _cheapest(self, search: LayoutSearch, running: int) -> Prediction | None:
        """The cheapest layout at the running threshold, unless another threshold allowed
        meets the SLOs on fewer devices (each searched only below the best so far)."""
        s = self.settings
        best = search.cheapest(s.prefill, s.decode, running)
        for threshold in s.thresholds:
            if threshold == running:
                continue
            ceiling = None if best is None else best.devices - 1
            found = search.cheapest(s.prefill, s.decode, threshold, ceiling)
            if found is not None and (best is None or found.devices < best.devices):
                best = found
        return best

    def _reason(self, best: Prediction | None, planned: Layout, wanted: float) -> str:
        plan = self._layout(planned)
        if best is None:
            return f"no layout within the bounds meets {wanted:.0%} of requests: planned {plan}"
        return f"{plan} is the cheapest to meet the SLOs ({best.attained:.0%} predicted)"

    def _outcome(self, found: str, current: Layout, target: Layout, planned: Layout) -> str:
        """`found`, then what it changes: "a -> b", or why nothing changes."""
        if target == current:
            held = " (held: scale-down window or cooldown)" if planned != current else ""
            return f"{found}; stays at {self._layout(current)}{held}"
        return f"{found}; {self._layout(current)} -> {self._layout(target)}"

    def _layout(self, layout: Layout) -> str:
        """ "2P+1D", with the threshold where the planner chooses it: "2P+1D@512"."""
        counts = f"{layout.prefill}P+{layout.decode}D"
        return f"{counts}@{layout.threshold}" if self.settings.thresholds else counts


def _rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 4)
