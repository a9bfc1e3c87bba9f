"""The operator's Prometheus metrics and its probe endpoint, served on one port:
`/metrics`, and `/healthz` (503 with the reason once the operator has lost its API server,
see `tandem.operator.liveness`; leading or standing by makes no difference)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)

from tandem.operator.liveness import Health

RECONCILE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# What starts a reconcile (kopf's causes, and the resync timer) and how it ends: every pair
# is exported from the start, so "Reconcile errors" reads 0, not "No data".
RECONCILE_TRIGGERS = ("create", "update", "resume", "timer", "planner")
RECONCILE_RESULTS = ("success", "invalid", "error")


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.reconciles = Counter(
            "tandem_operator_reconciles_total",
            "Reconciles by trigger and result (success, invalid, error).",
            ("trigger", "result"),
            registry=registry,
        )
        for trigger in RECONCILE_TRIGGERS:
            for result in RECONCILE_RESULTS:
                self.reconciles.labels(trigger, result)
        self.duration = Histogram(
            "tandem_operator_reconcile_seconds", "Time of one reconcile.",
            registry=registry, buckets=RECONCILE_BUCKETS,
        )  # fmt: skip
        self.applied = Counter(
            "tandem_operator_applied_objects_total", "Child objects applied.", registry=registry
        )
        self.pruned = Counter(
            "tandem_operator_pruned_objects_total", "Child objects deleted.", registry=registry
        )
        self.leader = Gauge(
            "tandem_operator_leader", "1 while this replica holds the lease.", registry=registry
        )
        ProcessCollector(registry=registry)  # process_cpu_seconds_total, _open_fds, ...


def serve_probes(
    registry: CollectorRegistry, host: str, port: int, health: Callable[[], Health]
) -> ThreadingHTTPServer:
    """Start the `/metrics` and `/healthz` server in a daemon thread; returns it (for
    `.server_address` and `.shutdown()`). `health()` decides `/healthz`."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/healthz":
                now = health()
                self._send(200 if now.ok else 503, f"{now.detail}\n".encode(), "text/plain")
            elif self.path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            else:
                self._send(404, b"not found\n", "text/plain")

        def log_message(self, *args: object) -> None:
            pass

        def _send(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="probes", daemon=True).start()
    return server
