"""The router's Prometheus metrics: requests by endpoint and status, what users see (time
to first token, end-to-end latency, tokens), routing time, per-worker selections, retries,
failed requests (answered with a 5xx or ended by an SSE error event), worker health and
restarts; per-request phases, lengths and finish reasons (`tandem.router.phase_metrics`);
the process's CPU, memory and open file descriptors. Labels `model`, `role="router"`,
`pod`; never a request id."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

from tandem.engine.telemetry.metrics import LABELS, LATENCY_BUCKETS
from tandem.router.phase_metrics import PhaseMetrics
from tandem.router.policy import Route
from tandem.router.workers import WorkerState

# `tandem_router_retries_total`'s reasons (router/dispatch.py)
RETRY_REASONS = ("decode_failed", "prefill_failed")
ROUTING_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 0.1)


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry, model: str, pod: str) -> None:
        self.registry = registry
        self._labels = {"model": model, "role": "router", "pod": pod}
        r = registry
        self.requests = Counter(
            "tandem_router_requests_total", "HTTP requests answered.",
            (*LABELS, "handler", "status"), registry=r,
        )  # fmt: skip
        self.in_flight = Gauge(
            "tandem_router_requests_in_flight",
            "Generation requests in progress.",
            LABELS,
            registry=r,
        )
        self.ttft = Histogram(
            "tandem_time_to_first_token_seconds", "Time to first token, as the client sees it.",
            LABELS, registry=r, buckets=LATENCY_BUCKETS,
        )  # fmt: skip
        self.e2e = Histogram(
            "tandem_e2e_request_latency_seconds", "Request latency, as the client sees it.",
            LABELS, registry=r, buckets=LATENCY_BUCKETS,
        )  # fmt: skip
        self.prompt_tokens = Counter(
            "tandem_prompt_tokens_total", "Prompt tokens.", LABELS, registry=r
        )
        self.generation_tokens = Counter(
            "tandem_generation_tokens_total", "Generated tokens.", LABELS, registry=r
        )
        self.routing = Histogram(
            "tandem_router_routing_seconds", "Time the policy took to pick workers.",
            LABELS, registry=r, buckets=ROUTING_BUCKETS,
        )  # fmt: skip
        self.selections = Counter(
            "tandem_router_worker_selections_total", "Times each worker was chosen.",
            (*LABELS, "worker", "worker_role"), registry=r,
        )  # fmt: skip
        self.prefix_blocks = Counter(
            "tandem_router_prefix_overlap_blocks_total",
            "Prompt blocks the chosen prefill worker had cached, per the KV-event index, by "
            "the cheapest tier holding each.",
            (*LABELS, "tier"), registry=r,
        )  # fmt: skip
        self.retries = Counter(
            "tandem_router_retries_total", "Choices retried on another decode worker.",
            (*LABELS, "reason"), registry=r,
        )  # fmt: skip
        self.failures = Counter(
            "tandem_router_request_failures_total",
            "Generation requests failed by the servers: `via` a 5xx status, or an SSE error "
            "event after the stream began.",
            (*LABELS, "reason", "via"), registry=r,
        )  # fmt: skip
        self.worker_restarts = Counter(
            "tandem_router_worker_restarts_total",
            "Workers seen back with a new agent name (a restarted process).",
            (*LABELS, "worker", "worker_role"), registry=r,
        )  # fmt: skip
        self.worker_healthy = Gauge(
            "tandem_router_worker_healthy", "1 when the worker passes health checks.",
            (*LABELS, "worker", "worker_role"), registry=r,
        )  # fmt: skip
        self.phases = PhaseMetrics(r, self._labels)
        ProcessCollector(registry=r)  # process_cpu_seconds_total, _resident_memory_bytes, ...
        # present from the start, 0 until a request runs: the no-healthy-decode alert's zero
        self.child(self.in_flight)
        for reason in RETRY_REASONS:  # 0, not "No data", until a worker fails
            self.child(self.retries, reason=reason)

    def observe_workers(self, workers: Iterable[WorkerState]) -> None:
        """One health series per worker in the pool now: one dropped from it leaves with
        it, not stuck at its last value."""
        self.worker_healthy.clear()
        for w in workers:
            self.child(self.worker_healthy, worker=w.url, worker_role=w.address.role).set(
                1 if w.healthy else 0
            )

    def child(self, metric, **labels: str):
        """`metric` bound to the router's labels plus `labels`."""
        return metric.labels(**self._labels, **labels)

    def observe_route(self, route: Route, seconds: float) -> None:
        self.child(self.routing).observe(seconds)
        for view in (route.decode, route.prefill):
            if view is not None:
                self.child(self.selections, worker=view.url, worker_role=view.role).inc()
        if (p := route.prefill) is not None:  # every tier, 0s too: each has a series
            tiers = {"device": p.device_blocks, "host": p.host_blocks, "disk": p.disk_blocks}
            for tier, num_blocks in tiers.items():
                self.child(self.prefix_blocks, tier=tier).inc(num_blocks)
