"""The planner process's work for one `LLMDeployment` (`PlannerLoop`), an interval at a time:

    read the resource -> scrape its routers -> the interval's traffic -> a decision
    -> set the planned pools' replicas (the Deployments' scale) -> an Event per change
    -> `status.planner` (server-side apply as `tandem-planner`) -> the planner's metrics

A pool `spec.slo` does not plan is never written, and its live count is its bounds (an
HPA may be scaling it). Where `spec.slo` lists remote-prefill thresholds, the running one is
the last written to `status.planner` (which the operator renders), and a new choice is
written there. A failure of one interval (a bad spec, no model shape, the API
server away) is counted and logged, and the next interval tries again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from tandem.operator.kinds import DEPLOYMENT, LLM_DEPLOYMENT
from tandem.operator.kube import ApiError, KubeApi, utc_now
from tandem.operator.names import child_name
from tandem.operator.slo import running_threshold
from tandem.operator.spec import LLMDeploymentSpec, parse
from tandem.planner.layout_search import Bounds, Layout
from tandem.planner.metrics import PlannerMetrics
from tandem.planner.planner import Decision, Planner
from tandem.planner.routers import RouterScraper
from tandem.planner.settings import device_profile, model_shape, planner_settings
from tandem.planner.stabilizer import POOLS, Stabilizer
from tandem.planner.traffic import RouterScrape, window

logger = logging.getLogger(__name__)
MANAGER = "tandem-planner"  # field manager of status.planner, and the Events' source


class PlannerLoop:
    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        name: str,
        metrics: PlannerMetrics,
        scraper: RouterScraper | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api, self.namespace, self.name = api, namespace, name
        self.metrics = metrics
        self.scraper = scraper or RouterScraper(api, namespace, name)
        self.clock = clock
        self.planner: Planner | None = None
        self._generation: int | None = None
        self._last: tuple[float, dict[str, RouterScrape]] | None = None
        self._last_change: str | None = None
        self.interval_s = 30.0

    def tick(self) -> Decision | None:
        """One interval; the decision made, or None (the first scrape, or a failure)."""
        try:
            return self._tick()
        except ApiError as exc:
            logger.warning("planner: the API server failed a call: %s", exc)
            self.metrics.failed("kubernetes")
        except Exception:  # a fault of the planner's own must not end the process
            logger.exception("planner: the interval failed")
            self.metrics.failed("internal")
        return None

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.tick()
            stop.wait(self.interval_s)

    def _tick(self) -> Decision | None:
        llmd = self.api.get(LLM_DEPLOYMENT, self.namespace, self.name)
        if llmd is None:
            logger.info("planner: LLMDeployment %s/%s is gone", self.namespace, self.name)
            return None
        spec = self._spec(llmd)
        if spec is None or not self._ensure_planner(llmd, spec):
            return None
        now, scrapes = self.clock(), self.scraper.scrape()
        last, self._last = self._last, (now, scrapes)
        if last is None:
            return None
        traffic = window(last[1], scrapes, now - last[0], spec.engine.block_size)
        current = self._current(llmd, spec)
        decision = self._planner_for(spec, current).decide(now, current, traffic)
        self._apply(llmd, spec, decision)
        return decision

    def _spec(self, llmd: dict[str, Any]) -> LLMDeploymentSpec | None:
        try:
            spec = parse(llmd)
        except ValueError as exc:
            logger.warning("planner: the LLMDeployment is invalid: %s", exc)
            self.metrics.failed("spec")
            return None
        if spec.slo is None:
            logger.info("planner: spec.slo is gone; nothing to plan")
            return None
        self.interval_s = spec.slo.interval_s
        return spec

    def _ensure_planner(self, llmd: dict[str, Any], spec: LLMDeploymentSpec) -> bool:
        """A planner for the resource's generation: its settings anew, what it learnt kept."""
        generation = llmd["metadata"].get("generation")
        if self.planner is not None and generation == self._generation:
            return True
        try:
            settings = planner_settings(spec, model_shape(spec), device_profile(spec))
        except ValueError as exc:
            self.metrics.failed("model")
            self._report_failure(llmd, str(exc))
            return False
        stabilizer = Stabilizer(spec.slo.scale_down_window_s, spec.slo.cooldown_s)
        if self.planner is not None:
            stabilizer = self.planner.stabilizer
            stabilizer.down_window_s = spec.slo.scale_down_window_s
            stabilizer.cooldown_s = spec.slo.cooldown_s
        correction = self.planner.correction if self.planner is not None else None
        self.planner = Planner(settings, stabilizer, correction)
        self._generation = generation
        return True

    def _planner_for(self, spec: LLMDeploymentSpec, current: Layout) -> Planner:
        """The planner with each unplanned pool pinned at its live count."""
        assert self.planner is not None and spec.slo is not None
        s = self.planner.settings
        if spec.slo.prefill is None:
            s = replace(s, prefill=Bounds(current.prefill, current.prefill))
        if spec.slo.decode is None:
            s = replace(s, decode=Bounds(current.decode, current.decode))
        self.planner.settings = s
        return self.planner

    def _current(self, llmd: dict[str, Any], spec: LLMDeploymentSpec) -> Layout:
        counts = {
            pool: self.api.scale(DEPLOYMENT, self.namespace, child_name(self.name, pool)) or 0
            for pool in POOLS
        }
        threshold = running_threshold(spec.slo, llmd.get("status"), spec.remote_prefill_threshold)
        return Layout(**counts, threshold=threshold)

    def _apply(self, llmd: dict[str, Any], spec: LLMDeploymentSpec, d: Decision) -> None:
        assert spec.slo is not None
        planned = {"prefill": spec.slo.prefill, "decode": spec.slo.decode}
        for pool in POOLS:
            want = getattr(d.target, pool)
            if planned[pool] is not None and want != getattr(d.current, pool):
                self.api.scale(DEPLOYMENT, self.namespace, child_name(self.name, pool), want)
        if d.changed:
            self._last_change = utc_now()
            self.api.event(llmd, "Normal", "Scaled", d.reason, component=MANAGER)
            logger.info("planner: %s", d.reason)
        assert self.planner is not None
        self.metrics.observe(d, self.planner.correction.scales)
        status = d.as_status()
        if spec.slo.remote_prefill_thresholds:
            status["remotePrefillThreshold"] = d.target.threshold
        if self._last_change is not None:
            status["lastChange"] = self._last_change
        self.api.apply_status(llmd, {"planner": status}, manager=MANAGER)

    def _report_failure(self, llmd: dict[str, Any], message: str) -> None:
        logger.warning("planner: %s", message)
        self.api.event(llmd, "Warning", "PlannerFailed", message, component=MANAGER)
        self.api.apply_status(llmd, {"planner": {"reason": message}}, manager=MANAGER)
