"""On a real cluster (skipped without a kubeconfig): install the CRD, run the operator with
kopf's KopfRunner, apply an example, and see the children, the status and, when the image
can run, Ready.

    TANDEM_E2E_IMAGE=tandem:dev TANDEM_E2E_MODEL_DIR=/models/tiny pytest -m e2e tests/operator
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.e2e

KUBECONFIG = Path(os.environ.get("KUBECONFIG", Path.home() / ".kube" / "config"))
if not KUBECONFIG.is_file():
    pytest.skip(f"no kubeconfig at {KUBECONFIG}", allow_module_level=True)

from kopf.testing import KopfRunner  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402

from tandem.operator.handlers import build_registry  # noqa: E402
from tandem.operator.kinds import DEPLOYMENT, LLM_DEPLOYMENT  # noqa: E402
from tandem.operator.kube import ApiError, KubeApi  # noqa: E402
from tandem.operator.metrics import OperatorMetrics  # noqa: E402
from tandem.operator.reconcile import Reconciler  # noqa: E402
from tests.operator.crd_schema import crd  # noqa: E402


def wait_for(check, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (value := check()) is not None:
            return value
        time.sleep(2)
    pytest.fail(f"timed out after {timeout_s} s")


def test_operator_reconciles_an_example():
    api = KubeApi.from_environment()
    namespace = f"tandem-e2e-{uuid.uuid4().hex[:6]}"
    api._call("PATCH", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
              "llmdeployments.tandem.dev", [("fieldManager", "tandem-e2e"), ("force", "true")],
              crd(), "application/apply-patch+yaml")  # fmt: skip
    api._call("POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}})
    llmd = {
        "apiVersion": "tandem.dev/v1alpha1", "kind": "LLMDeployment",
        "metadata": {"name": "tiny", "namespace": namespace},
        "spec": {
            "model": {"name": "tiny", "source": {"hostPath": {
                "path": os.environ.get("TANDEM_E2E_MODEL_DIR", "/models/tiny")}}},
            "image": os.environ.get("TANDEM_E2E_IMAGE", "tandem:dev"),
            "prefill": {"resources": {"limits": {"nvidia.com/gpu": 0}}},
            "decode": {"resources": {"limits": {"nvidia.com/gpu": 0}}},
        },
    }  # fmt: skip
    registry = build_registry(Reconciler(api), OperatorMetrics(CollectorRegistry()), 10)
    args = ["run", "--standalone", f"--namespace={namespace}", "--verbose"]
    try:
        with KopfRunner(args, registry=registry, timeout=600):
            api._call("POST", LLM_DEPLOYMENT.path(namespace), body=llmd)
            wait_for(lambda: api.get(DEPLOYMENT, namespace, "tiny-decode"), 60)
            status = wait_for(lambda: _status_with(api, namespace, "SpecValid"), 60)
            assert status["observedGeneration"] >= 1
            if os.environ.get("TANDEM_E2E_IMAGE"):
                wait_for(lambda: _status_with(api, namespace, "Ready"), 480)
    finally:
        with contextlib.suppress(ApiError):
            api._call("DELETE", f"/api/v1/namespaces/{namespace}")


def _status_with(api, namespace, condition):
    obj = api.get(LLM_DEPLOYMENT, namespace, "tiny") or {}
    conditions = {c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions", [])}
    return obj["status"] if conditions.get(condition) == "True" else None


def test_examples_apply_to_the_cluster_dry_run():
    api = KubeApi.from_environment()
    for path in (Path(__file__).resolve().parents[2] / "crds" / "examples").glob("*.yaml"):
        obj = yaml.safe_load(path.read_text())
        obj["metadata"]["namespace"] = "default"
        api._call("POST", LLM_DEPLOYMENT.path("default"), [("dryRun", "All")], obj)
