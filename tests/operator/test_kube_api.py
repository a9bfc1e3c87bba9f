"""KubeApi through the official client's configuration and HTTP stack, against a local
server that records each request and answers like the API server would."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from tandem.operator.kinds import DEPLOYMENT, LEASE
from tandem.operator.kube import ApiError, KubeApi
from tandem.operator.render import render
from tests.kubeconfig import write_kubeconfig
from tests.operator.crd_schema import example


@pytest.fixture
def server():
    """(url, requests, answers): answers maps (method, path) -> (status, body)."""
    requests: list[dict] = []
    answers: dict[tuple[str, str], tuple[int, dict]] = {}

    class Recorder(BaseHTTPRequestHandler):
        def _handle(self):
            url = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            requests.append({
                "method": self.command, "path": url.path, "query": parse_qs(url.query),
                "content_type": self.headers.get("Content-Type"),
                "authorization": self.headers.get("Authorization"), "body": body,
            })  # fmt: skip
            status, answer = answers.get((self.command, url.path), (200, body or {}))
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", requests, answers
    httpd.shutdown()


@pytest.fixture
def api(server, tmp_path, monkeypatch):
    url = server[0]
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path, url, "secret-token")))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return KubeApi.from_environment()


def test_apply_is_a_forced_server_side_apply_by_the_operator(api, server):
    _, requests, _ = server
    objects = render(example("full"))
    for obj in objects:
        api.apply(obj)
    paths = [r["path"] for r in requests]
    assert "/apis/apps/v1/namespaces/inference/deployments/qwen-decode" in paths
    assert "/api/v1/namespaces/inference/configmaps/qwen-config" in paths
    assert "/apis/monitoring.coreos.com/v1/namespaces/inference/podmonitors/qwen" in paths
    assert {p.rsplit("/", 1)[0] for p in paths} >= {
        "/api/v1/namespaces/inference/persistentvolumeclaims",
        "/apis/batch/v1/namespaces/inference/jobs",
    }
    for request, obj in zip(requests, objects, strict=True):
        assert request["method"] == "PATCH"
        assert request["content_type"] == "application/apply-patch+yaml"
        assert request["query"] == {"fieldManager": ["tandem-operator"], "force": ["true"]}
        assert request["authorization"] == "Bearer secret-token"
        assert request["body"] == obj


def test_status_is_applied_to_the_status_subresource(api, server):
    _, requests, _ = server
    llmd = example("minimal")
    api.apply_status(llmd, {"phase": "Ready"})
    (request,) = requests
    assert (
        request["path"]
        == "/apis/tandem.dev/v1alpha1/namespaces/default/llmdeployments/llama/status"
    )
    assert request["body"]["status"] == {"phase": "Ready"}
    assert request["body"]["kind"] == "LLMDeployment"


def test_a_status_applied_by_another_manager_names_it(api, server):
    _, requests, _ = server
    api.apply_status(example("minimal"), {"planner": {"reason": "r"}}, manager="tandem-planner")
    assert requests[0]["query"]["fieldManager"] == ["tandem-planner"]


def test_scale_reads_and_merge_patches_the_scale_subresource(api, server):
    _, requests, answers = server
    path = "/apis/apps/v1/namespaces/ns/deployments/llama-decode/scale"
    answers[("GET", path)] = (200, {"kind": "Scale", "spec": {"replicas": 3}})
    answers[("PATCH", path)] = (200, {"kind": "Scale", "spec": {"replicas": 5}})
    assert api.scale(DEPLOYMENT, "ns", "llama-decode") == 3
    assert api.scale(DEPLOYMENT, "ns", "llama-decode", 5) == 5
    patch = requests[-1]
    assert patch["method"] == "PATCH" and patch["body"] == {"spec": {"replicas": 5}}
    assert patch["content_type"] == "application/merge-patch+json"
    gone = "/apis/apps/v1/namespaces/ns/deployments/gone/scale"
    answers[("GET", gone)] = (404, {"kind": "Status", "message": "not found"})
    assert api.scale(DEPLOYMENT, "ns", "gone") is None


def test_the_status_apply_holds_the_operators_keys_alone(api, server):
    """Server-side apply keeps what another manager wrote (the planner's `planner`) as long
    as the operator's apply never names it."""
    _, requests, _ = server
    llmd = example("minimal") | {"status": {"phase": "Ready", "planner": {"reason": "ok"}}}
    api.apply_status(llmd, {"phase": "Progressing"})
    assert requests[0]["body"]["status"] == {"phase": "Progressing"}


def test_an_unforced_apply_under_another_manager_may_conflict(api, server):
    _, requests, answers = server
    (decode,) = [o for o in render(example("minimal")) if o["kind"] == "Deployment"
                 and o["metadata"]["name"] == "llama-decode"]  # fmt: skip
    path = "/apis/apps/v1/namespaces/default/deployments/llama-decode"
    answers[("PATCH", path)] = (409, {"message": "Apply failed with 1 conflict"})
    with pytest.raises(ApiError) as refused:
        api.apply(decode, "tandem-operator-handover", force=False)
    assert refused.value.status == 409
    assert requests[0]["query"] == {"fieldManager": ["tandem-operator-handover"]}


def test_list_get_and_delete(api, server):
    _, requests, answers = server
    path = "/apis/apps/v1/namespaces/ns/deployments"
    answers[("GET", path)] = (200, {"items": [{"metadata": {"name": "a"}}]})
    answers[("GET", f"{path}/gone")] = (404, {"kind": "Status", "message": "not found"})
    assert api.list(DEPLOYMENT, "ns", "tandem.dev/deployment=x") == [{"metadata": {"name": "a"}}]
    assert requests[0]["query"] == {"labelSelector": ["tandem.dev/deployment=x"]}
    assert api.get(DEPLOYMENT, "ns", "gone") is None
    api.delete(DEPLOYMENT, "ns", "a", "uid-1")
    assert requests[-1]["method"] == "DELETE"
    assert requests[-1]["body"] == {
        "propagationPolicy": "Background",
        "preconditions": {"uid": "uid-1"},
    }


def test_refusals_raise_with_the_servers_message(api, server):
    _, _, answers = server
    path = "/apis/apps/v1/namespaces/ns/deployments/x"
    answers[("GET", path)] = (403, {"kind": "Status", "message": "deployments is forbidden"})
    with pytest.raises(ApiError, match="403: deployments is forbidden"):
        api.get(DEPLOYMENT, "ns", "x")
    answers[("DELETE", path)] = (409, {"message": "uid precondition failed"})
    api.delete(DEPLOYMENT, "ns", "x", "stale-uid")  # replaced meanwhile: nothing to prune


def test_events_name_the_resource(api, server):
    _, requests, _ = server
    api.event(example("minimal"), "Warning", "InvalidSpec", "spec.x: bad")
    (request,) = requests
    assert request["method"] == "POST" and request["path"] == "/api/v1/namespaces/default/events"
    body = request["body"]
    assert body["involvedObject"]["kind"] == "LLMDeployment" and body["reason"] == "InvalidSpec"
    assert body["type"] == "Warning" and body["message"] == "spec.x: bad"
    assert body["source"] == {"component": "tandem-operator"}
    api.event(example("minimal"), "Normal", "Scaled", "1P+1D -> 2P+1D", component="tandem-planner")
    assert requests[-1]["body"]["source"] == {"component": "tandem-planner"}


def test_lease_create_and_replace(api, server):
    _, requests, _ = server
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
             "metadata": {"name": "l", "resourceVersion": "7"}, "spec": {}}  # fmt: skip
    api.create(LEASE, "ops", lease)
    api.replace(LEASE, "ops", lease)
    assert [(r["method"], r["path"]) for r in requests] == [
        ("POST", "/apis/coordination.k8s.io/v1/namespaces/ops/leases"),
        ("PUT", "/apis/coordination.k8s.io/v1/namespaces/ops/leases/l"),
    ]
