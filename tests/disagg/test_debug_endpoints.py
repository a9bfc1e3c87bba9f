"""A node's debug views are off unless asked for: every `/debug/...` path is a 404 in the
API's error shape, while `/kv/snapshot` (the routers' prefix-index resync) stays. Turned on,
`/debug/blocks` takes at most MAX_BLOCK_HASHES hashes. On the real app without a model;
and `tandem serve --debug-endpoints` turns them on for its nodes."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from tandem.node.debug_routes import MAX_BLOCK_HASHES
from tandem.node.server import NodeServer
from tandem.router.serve import add_arguments, plan


def unbuilt(loop):
    raise AssertionError("no engine thread in these tests")


def client(debug_endpoints: bool) -> TestClient:
    server = NodeServer(unbuilt, CollectorRegistry(), debug_endpoints=debug_endpoints)
    return TestClient(server.app)  # outside a `with`: no lifespan, no engine thread


@pytest.mark.parametrize(
    "method, path",
    [("GET", "/debug/kv"), ("GET", "/debug/steps"), ("POST", "/debug/blocks"),
     ("GET", "/debug/anything/else")],
)  # fmt: skip
def test_debug_views_are_a_404_in_the_api_s_shape_unless_turned_on(method, path):
    r = client(False).request(method, path, json={"hashes": [1]})
    assert r.status_code == 404, r.text
    error = r.json()["error"]
    assert error["type"] == "not_found_error" and error["code"] == 404
    assert "--debug-endpoints" in error["message"]


def test_the_kv_snapshot_is_not_a_debug_view():
    r = client(False).get("/kv/snapshot")
    assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable"


def test_debug_blocks_takes_at_most_max_block_hashes():
    on = client(True)
    over = on.post("/debug/blocks", json={"hashes": list(range(MAX_BLOCK_HASHES + 1))})
    assert over.status_code == 400, over.text
    assert over.json()["error"]["param"] == "hashes"
    at = on.post("/debug/blocks", json={"hashes": list(range(MAX_BLOCK_HASHES))})
    assert at.status_code == 503, at.text  # past validation: the model is not loaded
    assert on.get("/debug/kv").status_code == 503


def _commands(*flags: str) -> dict[str, list[str]]:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--prefill", "1", "--decode", "1", *flags])
    return {child.name: child.cmd for child in plan(args, Path("model"))}


def test_tandem_serve_turns_the_nodes_debug_views_on_only_when_asked():
    assert not any("--debug-endpoints" in cmd for cmd in _commands().values())
    on = _commands("--debug-endpoints")
    assert "--debug-endpoints" in on["prefill-0"] and "--debug-endpoints" in on["decode-0"]
    assert "--debug-endpoints" not in on["router"]
