"""`tandem planner`: its flags, and its metrics server answering over real HTTP."""

from __future__ import annotations

import subprocess
import sys

import httpx
from prometheus_client import CollectorRegistry

from tandem.node.metrics_server import MetricsServer
from tandem.planner.cli import metrics_app
from tandem.planner.metrics import PlannerMetrics
from tests.bounds import HANG_S
from tests.disagg.nodes import metric_value


def test_help_names_the_flags_the_operator_passes():
    out = subprocess.run(
        [sys.executable, "-P", "-m", "tandem.cli", "planner", "--help"],
        capture_output=True, text=True, timeout=HANG_S, check=True,
    ).stdout  # fmt: skip
    for flag in ("--llmdeployment", "--namespace", "--metrics-port"):
        assert flag in out, out


def test_the_metrics_server_serves_health_and_the_planners_series_from_the_start():
    registry = CollectorRegistry()
    PlannerMetrics(registry, "llama")
    server = MetricsServer(metrics_app(registry), "127.0.0.1", 0, log_level="warning")
    server.start()
    try:
        url = f"http://127.0.0.1:{server.port}"
        assert httpx.get(f"{url}/health", timeout=HANG_S).json() == {"status": "ok"}
        text = httpx.get(f"{url}/metrics", timeout=HANG_S).text
        up = {"deployment": "llama", "pool": "decode", "direction": "up"}
        assert "tandem_planner_scalings_total" in text
        assert metric_value(text, "tandem_planner_scalings_total", **up) == 0
        assert metric_value(text, "tandem_planner_failures_total", reason="model") == 0
    finally:
        server.stop()
