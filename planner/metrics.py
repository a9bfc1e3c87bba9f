"""The planner's own Prometheus metrics: its inputs (request rate, measured attainment), its
outputs (replicas current and desired per pool, the remote-prefill threshold, predicted
attainment), how far the
simulator was from the measurements, the step scales it learnt, its decision time, its
scalings and its failures. Labels `deployment` (the LLMDeployment), `pool`."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tandem.planner.planner import Decision

POOLS = ("prefill", "decode")
DECISION_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
FAILURE_REASONS = ("spec", "model", "kubernetes", "internal")


class PlannerMetrics:
    def __init__(self, registry: CollectorRegistry, deployment: str) -> None:
        self.registry = registry
        self._labels = {"deployment": deployment}
        labels, r = ("deployment",), registry
        self.replicas = Gauge(
            "tandem_planner_replicas", "Replicas per pool: `state` current (set before this "
            "decision) or desired (set by it).", (*labels, "pool", "state"), registry=r,
        )  # fmt: skip
        self.attainment = Gauge(
            "tandem_planner_slo_attainment", "Share of requests within both SLO targets: "
            "`source` measured (the routers, last interval), predicted (the desired layout, "
            "simulated) or current (the current layout, simulated).",
            (*labels, "source"), registry=r,
        )  # fmt: skip
        self.threshold = Gauge(
            "tandem_planner_remote_prefill_threshold", "The decode pool's remote-prefill "
            "threshold in prompt tokens: `state` current or desired.", (*labels, "state"),
            registry=r,
        )  # fmt: skip
        self.rate = Gauge(
            "tandem_planner_request_rate", "Requests per second the routers received in the "
            "last interval.", labels, registry=r,
        )  # fmt: skip
        self.error = Gauge(
            "tandem_planner_prediction_error_ratio", "Measured / simulated median minus 1, "
            "for the current layout (`metric` ttft or tpot).", (*labels, "metric"), registry=r,
        )  # fmt: skip
        self.scale = Gauge(
            "tandem_planner_step_scale", "The step-time factor learnt from the measurements, "
            "per node role.", (*labels, "role"), registry=r,
        )  # fmt: skip
        self.seconds = Histogram(
            "tandem_planner_decision_seconds", "Time one decision took (simulations included).",
            labels, registry=r, buckets=DECISION_BUCKETS,
        )  # fmt: skip
        self.scalings = Counter(
            "tandem_planner_scalings_total", "Replica changes made, per pool and direction.",
            (*labels, "pool", "direction"), registry=r,
        )  # fmt: skip
        self.failures = Counter(
            "tandem_planner_failures_total", "Intervals without a decision, by reason.",
            (*labels, "reason"), registry=r,
        )  # fmt: skip
        for pool in POOLS:  # 0, not "No data", before the first change
            for direction in ("up", "down"):
                self.scalings.labels(**self._labels, pool=pool, direction=direction)
        for reason in FAILURE_REASONS:
            self.failures.labels(**self._labels, reason=reason)

    def observe(self, d: Decision, scales: dict[str, float]) -> None:
        for pool in POOLS:
            current, desired = getattr(d.current, pool), getattr(d.target, pool)
            self.replicas.labels(**self._labels, pool=pool, state="current").set(current)
            self.replicas.labels(**self._labels, pool=pool, state="desired").set(desired)
            if desired != current:
                direction = "up" if desired > current else "down"
                self.scalings.labels(**self._labels, pool=pool, direction=direction).inc()
        self.threshold.labels(**self._labels, state="current").set(d.current.threshold)
        self.threshold.labels(**self._labels, state="desired").set(d.target.threshold)
        sources = {"measured": d.measured_attainment, "predicted": d.predicted_attainment,
                   "current": d.current_attainment}  # fmt: skip
        for source, value in sources.items():
            if value is not None:
                self.attainment.labels(**self._labels, source=source).set(value)
        self.rate.labels(**self._labels).set(d.rate_rps)
        for metric, value in d.errors.items():
            self.error.labels(**self._labels, metric=metric).set(value)
        for role, value in scales.items():
            self.scale.labels(**self._labels, role=role).set(value)
        self.seconds.labels(**self._labels).observe(d.search_s)

    def failed(self, reason: str) -> None:
        self.failures.labels(**self._labels, reason=reason).inc()
