"""A node's two HTTP ports: the metrics port answers `/metrics`, `/health` and
`/health/live` and nothing else (no control route, no debug view), and the control port no
longer serves `/metrics` or `/health/live`; on the real apps without a model, on a real
socket, and in a node process."""

from __future__ import annotations

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from tandem.decode_node.server import add_decode_routes
from tandem.node.metrics_server import MetricsServer
from tandem.node.server import NodeServer
from tests.bounds import HANG_S
from tests.disagg.nodes import Node

METRICS_PATHS = {"/metrics", "/health", "/health/live"}


def unbuilt(loop):
    raise AssertionError("no engine thread in these tests")


@pytest.fixture
def server() -> NodeServer:
    server = NodeServer(unbuilt, CollectorRegistry(), debug_endpoints=True)
    add_decode_routes(server)
    return server


def paths(app) -> set[str]:
    return {route.path for route in app.routes}


def test_the_metrics_app_has_only_metrics_and_health(server):
    assert paths(server.metrics_app) == METRICS_PATHS
    client = TestClient(server.metrics_app)  # outside a `with`: no engine thread
    assert client.get("/metrics").headers["content-type"].startswith("text/plain")
    assert client.get("/health").status_code == 503  # loading
    assert client.get("/health/live").json() == {"status": "loading"}
    for method, path in [("POST", "/generate"), ("POST", "/abort"), ("GET", "/kv/snapshot"),
                         ("GET", "/debug/kv"), ("GET", "/docs")]:  # fmt: skip
        r = client.request(method, path, json={})
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error", path


def test_the_control_app_serves_no_metrics_nor_liveness(server):
    assert {"/generate", "/abort", "/health", "/kv/snapshot"} <= paths(server.app)
    client = TestClient(server.app)
    for path in ("/metrics", "/health/live"):
        assert client.get(path).status_code == 404, path


def test_the_metrics_server_binds_at_once_and_stops():
    server = NodeServer(unbuilt, CollectorRegistry())
    metrics = MetricsServer(server.metrics_app, "127.0.0.1", 0, "warning")
    assert metrics.port > 0  # bound before start: a port in use fails before the engine
    metrics.start()
    try:
        url = f"http://127.0.0.1:{metrics.port}"
        r = httpx.get(f"{url}/health/live", timeout=HANG_S)
        assert r.status_code == 200 and r.json() == {"status": "loading"}
        assert httpx.get(f"{url}/metrics", timeout=HANG_S).status_code == 200
    finally:
        metrics.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{metrics.port}/health", timeout=HANG_S)


def test_a_node_process_serves_each_path_on_its_own_port(llama_dir, tmp_path):
    node = Node("decode", llama_dir, tmp_path, "--max-model-len", "256")
    try:
        health = node.start().wait_ready()
        assert health["metrics_port"] == node.metrics_port  # what the router reports
        metrics = f"http://127.0.0.1:{node.metrics_port}"
        assert "tandem_" in node.metrics()
        for path in ("/health", "/health/live"):
            assert httpx.get(f"{metrics}{path}", timeout=HANG_S).status_code == 200, path
        r = httpx.post(f"{metrics}/generate", json={"request_id": "r", "token_ids": [1]},
                       timeout=HANG_S)  # fmt: skip
        assert r.status_code == 404
        assert httpx.get(f"{node.url}/metrics", timeout=HANG_S).status_code == 404
    finally:
        node.stop()
