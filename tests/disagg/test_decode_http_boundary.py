"""The decode node's HTTP boundary, on its real app without a model: what `/generate`
refuses before anything reaches the engine thread (a body not of the wire schema: a prefill
endpoint that is not `tcp://host:port`, a sampling value of the wrong type, another
protocol version; a request without the deployment's token), a live request id (409), and
unknown routes or methods, all answered in the API's error shape naming the field."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from tandem.decode_node.node import DuplicateRequest
from tandem.decode_node.server import add_decode_routes
from tandem.engine.api.deployment_token import DeploymentToken
from tandem.engine.api.wire import PROTOCOL_VERSION
from tandem.node.server import NodeServer


def unbuilt(loop):
    raise AssertionError("no engine thread in these tests")


@pytest.fixture
def server() -> NodeServer:
    server = NodeServer(unbuilt, CollectorRegistry())
    add_decode_routes(server)
    return server


TOKEN = DeploymentToken("the-deployment-token")


@pytest.fixture
def guarded() -> NodeServer:
    server = NodeServer(unbuilt, CollectorRegistry(), token=TOKEN)
    add_decode_routes(server)
    return server


def client(server: NodeServer) -> TestClient:
    return TestClient(server.app)  # outside a `with`: no lifespan, no engine thread


def body(**fields) -> dict:
    return {"request_id": "r", "token_ids": [1, 2, 3], **fields}


def assert_error(r, status: int, kind: str) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == status and error["type"] == kind and error["message"]
    return error


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"prefill": "x"}, "prefill"),
        ({"prefill": "tcp://host"}, "prefill"),
        ({"prefill": "ipc:///tmp/sock"}, "prefill"),
        ({"prefill": "tcp://host:0"}, "prefill"),
        ({"prefill": "tcp://host:65536"}, "prefill"),
        ({"prefill": "tcp://a b:1"}, "prefill"),
        ({"prefill_alternates": ["tcp://h:2", "nope"]}, "prefill_alternates.1"),
    ],
)  # fmt: skip
def test_a_prefill_endpoint_not_of_the_form_tcp_host_port_is_a_400(server, fields, param):
    error = assert_error(client(server).post("/generate", json=body(**fields)), 400,
                         "invalid_request_error")  # fmt: skip
    assert error["param"] == param


@pytest.mark.parametrize(
    "endpoint", ["tcp://127.0.0.1:5555", "tcp://prefill-0.prefill.ns.svc:7000", "tcp://[::1]:9"]
)
def test_a_well_formed_endpoint_passes_the_boundary(server, endpoint):
    r = client(server).post("/generate", json=body(prefill=endpoint, prefill_alternates=[endpoint]))
    assert_error(r, 503, "service_unavailable")  # past validation: the model is not loaded


def test_a_live_request_id_is_a_409_conflict(server):
    def add(inp, sink):
        raise DuplicateRequest("request id 'r' is already in use")

    async def call(fn):
        return fn()

    server.ready.set()
    server.role = SimpleNamespace(node=SimpleNamespace(add=add))
    server.call = call
    error = assert_error(client(server).post("/generate", json=body()), 409, "conflict_error")
    assert error["message"] == "request id 'r' is already in use"


def test_an_unknown_route_is_a_404_in_the_api_s_shape(server):
    error = assert_error(client(server).get("/no/such/route"), 404, "not_found_error")
    assert error["message"] == "Not Found"


def test_a_wrong_method_is_a_405_in_the_api_s_shape(server):
    r = client(server).get("/generate")
    assert_error(r, 405, "invalid_request_error")
    assert r.headers["allow"] == "POST"


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"sampling": {"temperature": "hot"}}, "sampling.temperature"),
        ({"sampling": {"top_p": 7}}, "sampling"),
        ({"sampling": {"logit_bias": [1]}}, "sampling.logit_bias"),  # found by the fuzz suite
        ({"sampling": {"structured_outputs": {}}}, "sampling.structured_outputs"),
        ({"token_ids": "1 2 3"}, "token_ids"),
        ({"request_id": ""}, "request_id"),
        ({"prefill_alternates": ["tcp://h:1"] * 65}, "prefill_alternates"),
    ],
)  # fmt: skip
def test_a_body_not_of_the_wire_schema_is_a_400_naming_the_field(server, fields, param):
    error = assert_error(client(server).post("/generate", json=body(**fields)), 400,
                         "invalid_request_error")  # fmt: skip
    assert error["param"] == param


def test_a_field_the_node_does_not_know_is_ignored_by_rule(server):
    fields = {"sampling": {"future_knob": 1}, "future_field": [1]}
    r = client(server).post("/generate", json=body(**fields))
    assert_error(r, 503, "service_unavailable")  # past validation: the model is not loaded


def test_another_protocol_version_is_a_400_that_says_so(server):
    r = client(server).post("/generate", json=body(protocol=PROTOCOL_VERSION + 1))
    assert "protocol" in assert_error(r, 400, "invalid_request_error")["message"]


@pytest.mark.parametrize("path", ["/generate", "/abort", "/kv/snapshot"])
@pytest.mark.parametrize(
    "header", [None, "Bearer wrong-token-of-the-same-len", "the-deployment-token"]
)
def test_a_control_route_without_the_token_is_a_401(guarded, path, header):
    headers = {"authorization": header} if header else {}
    method = "GET" if path == "/kv/snapshot" else "POST"
    r = client(guarded).request(method, path, json=body(), headers=headers)
    assert_error(r, 401, "authentication_error")


@pytest.mark.parametrize("path", ["/generate", "/kv/snapshot"])
def test_the_token_opens_the_control_routes(guarded, path):
    method = "GET" if path == "/kv/snapshot" else "POST"
    r = client(guarded).request(method, path, json=body(), headers=TOKEN.headers())
    assert_error(r, 503, "service_unavailable")  # past the check: the model is not loaded


def test_health_answers_without_the_token(guarded):
    assert client(guarded).get("/health").status_code == 503  # loading, not 401
