"""The planner process's interval (`PlannerLoop.tick`) against an in-memory API server
(tests/operator/fake_api.py, with the scale subresource) and routers whose metrics are the
real `RouterMetrics`: it reads the resource, scrapes, decides, scales only the pools it
plans, says why in an Event and in `status.planner`, and survives every failure."""

from __future__ import annotations

import copy
from dataclasses import replace

from prometheus_client import CollectorRegistry, generate_latest

from tandem.operator.kinds import DEPLOYMENT, Kind
from tandem.operator.kube import ApiError
from tandem.planner.loop import MANAGER, PlannerLoop
from tandem.planner.metrics import PlannerMetrics
from tests.disagg.nodes import metric_value
from tests.operator.crd_schema import example, validate
from tests.operator.fake_api import FakeApi
from tests.planner.test_planner import interval
from tests.planner.test_traffic import Router

SLO = {
    "ttftMs": 500, "tpotMs": 50, "interval": "30s", "scaleDownWindow": "60s", "cooldown": "0s",
    "decode": {"minReplicas": 1, "maxReplicas": 4},
    "simulator": {"profile": "h100", "model": "llama-3-8b"},
}  # fmt: skip


class ScalingApi(FakeApi):
    """FakeApi that records the status managers, signs events and can be down."""

    def __init__(self) -> None:
        super().__init__()
        self.managers: list[str] = []
        self.down = False

    def scale(self, kind: Kind, namespace: str, name: str, replicas: int | None = None):
        if self.down:
            raise ApiError(503, "connection refused")
        return super().scale(kind, namespace, name, replicas)

    def apply_status(self, llmd, status, manager="tandem-operator"):
        self.managers.append(manager)
        return super().apply_status(llmd, status)

    def event(self, llmd, kind, reason, message, component="tandem-operator"):
        super().event(llmd, kind, reason, f"{component}: {message}")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Scraper:
    def __init__(self, router: Router) -> None:
        self.router = router

    def scrape(self):
        return {"router-0": self.router.scrape()}


def setup(slo: dict = SLO, prefill: int = 1):
    api, clock, router = ScalingApi(), Clock(), Router("router-0")
    llmd = example("minimal")
    llmd["metadata"]["generation"] = 1
    llmd["spec"]["slo"] = copy.deepcopy(slo)
    api.objects[("LLMDeployment", "default", "llama")] = llmd
    for pool, replicas in (("prefill", prefill), ("decode", 1)):
        api.objects[("Deployment", "default", f"llama-{pool}")] = {
            "metadata": {"name": f"llama-{pool}"}, "spec": {"replicas": replicas}}  # fmt: skip
    metrics = PlannerMetrics(CollectorRegistry(), "llama")
    loop = PlannerLoop(api, "default", "llama", metrics, Scraper(router), clock)
    return api, clock, router, loop


def replicas(api: ScalingApi, pool: str) -> int:
    return api.scale(DEPLOYMENT, "default", f"llama-{pool}")


def test_a_busy_interval_scales_the_planned_pool_and_says_why():
    api, clock, router, loop = setup()
    assert loop.tick() is None  # the first scrape: no interval yet
    clock.now = 30.0
    interval(router, 1800, 30.0, ttft=3.0)  # 60 req/s, far past the TTFT target
    decision = loop.tick()
    assert decision is not None and decision.changed
    assert replicas(api, "decode") == decision.target.decode > 1
    assert replicas(api, "prefill") == 1  # not planned: never written
    assert decision.target.prefill == 1
    ((kind, reason, message),) = api.events
    assert (kind, reason) == ("Normal", "Scaled") and message.startswith(f"{MANAGER}: ")
    status = api.status["planner"]
    assert status["decode"] == {"current": 1, "desired": decision.target.decode}
    assert status["lastChange"] and status["measuredAttainment"] == 0.0
    assert api.managers == [MANAGER]
    assert (
        validate({**example("minimal"), "status": api.status}) == []
    )  # as the API server checks it
    text = generate_latest(loop.metrics.registry).decode()
    labels = {"pool": "decode", "state": "desired"}
    assert metric_value(text, "tandem_planner_replicas", **labels) == decision.target.decode
    assert metric_value(text, "tandem_planner_scalings_total", pool="decode", direction="up") == 1
    assert metric_value(text, "tandem_planner_decision_seconds_count") == 1


def test_an_idle_deployment_shrinks_after_the_window_and_a_change_of_spec_keeps_the_learning():
    api, clock, _, loop = setup()
    api.objects[("Deployment", "default", "llama-decode")]["spec"]["replicas"] = 3
    loop.tick()
    for now in (30.0, 60.0):
        clock.now = now
        assert loop.tick().target.decode == 3  # held: the window has not passed
    clock.now = 95.0
    assert loop.tick().target.decode == 1
    assert replicas(api, "decode") == 1
    learnt = loop.planner.correction
    live = api.objects[("LLMDeployment", "default", "llama")]
    live["spec"]["slo"]["decode"]["maxReplicas"] = 2
    live["metadata"]["generation"] = 2
    clock.now = 125.0
    loop.tick()
    assert loop.planner.settings.decode.max_replicas == 2
    assert loop.planner.correction is learnt


def test_failures_are_counted_and_the_next_interval_goes_on():
    api, clock, router, loop = setup(slo={**SLO, "simulator": {"model": "/no/such/model"}})
    assert loop.tick() is None
    ((_, reason, message),) = api.warnings
    assert reason == "PlannerFailed" and "spec.slo.simulator.model" in message
    assert "/no/such/model" in api.status["planner"]["reason"]
    assert validate({**example("minimal"), "status": api.status}) == []
    live = api.objects[("LLMDeployment", "default", "llama")]
    live["spec"]["slo"]["ttftMs"] = -1  # invalid: the planner holds
    assert loop.tick() is None
    live["spec"]["slo"] = copy.deepcopy(SLO)
    live["metadata"]["generation"] = 2
    assert loop.tick() is None  # a planner now; its first scrape
    api.down = True
    clock.now = 30.0
    assert loop.tick() is None  # the API server away: counted, nothing raised
    api.down = False
    loop.scraper = None  # a fault of the planner's own: counted, the process goes on
    assert loop.tick() is None
    text = generate_latest(loop.metrics.registry).decode()
    for reason in ("model", "spec", "kubernetes", "internal"):
        assert metric_value(text, "tandem_planner_failures_total", reason=reason) == 1, reason
    loop.scraper = Scraper(router)
    clock.now = 60.0
    interval(router, 60, 30.0)
    assert loop.tick() is not None


def test_a_listed_threshold_is_chosen_written_to_the_status_and_read_back_as_running():
    slo = {**SLO, "scaleDownWindow": "0s", "prefill": {"minReplicas": 1, "maxReplicas": 1},
           "remotePrefillThresholds": [1024]}  # fmt: skip
    api, clock, router, loop = setup(slo)
    loop.tick()
    loop.planner.settings = replace(loop.planner.settings, max_requests=300)  # a faster test
    clock.now = 30.0
    interval(router, 900, 30.0, ttft=3.0)  # 30 req/s: one prefill pod needs help
    decision = loop.tick()
    assert decision.current.threshold == 0 and decision.target.threshold == 1024
    assert api.status["planner"]["remotePrefillThreshold"] == 1024
    assert "@1024" in api.events[-1][2]
    assert validate({**example("minimal"), "status": api.status}) == []
    text = generate_latest(loop.metrics.registry).decode()
    assert metric_value(text, "tandem_planner_remote_prefill_threshold", state="desired") == 1024
    live = api.objects[("LLMDeployment", "default", "llama")]
    live["status"] = copy.deepcopy(api.status)
    clock.now = 60.0
    interval(router, 900, 30.0)
    assert loop.tick().current.threshold == 1024  # what the operator now renders
