"""`tandem planner`: the SLO planner of one LLMDeployment, run by the operator as the
Deployment `<name>-planner` when the resource has `spec.slo` (docs/autoscaling.md)."""

from __future__ import annotations

import argparse
import logging
import signal
import threading

from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from tandem.node.metrics_server import MetricsServer

METRICS_PORT = 9090


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--llmdeployment", required=True, help="the LLMDeployment to plan for")
    parser.add_argument("--namespace", default="default", help="its namespace")
    parser.add_argument("--metrics-port", type=int, default=METRICS_PORT,
                        help="/metrics and /health (default %(default)s)")  # fmt: skip
    parser.add_argument("--host", default="0.0.0.0", help="address of the metrics server")


def run(args: argparse.Namespace) -> None:
    from tandem.operator.kube import KubeApi
    from tandem.planner.loop import PlannerLoop
    from tandem.planner.metrics import PlannerMetrics

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    # the simulated routers' worker pools and every scrape would log at INFO each interval
    for noisy in ("tandem.router", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    registry = CollectorRegistry()
    metrics = PlannerMetrics(registry, args.llmdeployment)
    server = MetricsServer(metrics_app(registry), args.host, args.metrics_port)
    loop = PlannerLoop(KubeApi.from_environment(), args.namespace, args.llmdeployment, metrics)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    server.start()
    try:
        loop.run(stop)
    finally:
        server.stop()


def metrics_app(registry: CollectorRegistry) -> FastAPI:
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    return app
