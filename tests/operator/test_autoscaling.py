"""`spec.autoscaling.<role>` without a target, as HPA users write it: each role's default
target (router: cpu 80%, prefill: 4 requests waiting, decode: 80% KV cache), the cpu
request a cpu target needs, and the CRD defaulting and refusing the same way."""

from __future__ import annotations

import kubernetes_validate
import pytest
from kubernetes_validate.utils import latest_version

from tandem.operator.render import render
from tests.operator.crd_schema import example, validate, with_defaults

CPU = {"requests": {"cpu": "500m"}}


def scaled(role: str, resources: dict | None = None, **scaling) -> dict:
    llmd = example("minimal")
    llmd["spec"]["autoscaling"] = {role: {"maxReplicas": 5, **scaling}}
    if resources is not None:
        llmd["spec"][role] = {"resources": resources}
    return llmd


def hpa(llmd: dict, role: str) -> dict:
    (found,) = [o for o in render(llmd) if o["kind"] == "HorizontalPodAutoscaler"
                and o["metadata"]["name"].endswith(f"-{role}")]  # fmt: skip
    return found["spec"]


@pytest.mark.parametrize(
    ("role", "resources", "metric"),
    [
        ("router", CPU, {"type": "Resource", "resource": {"name": "cpu", "target": {
            "type": "Utilization", "averageUtilization": 80}}}),
        ("prefill", None, {"type": "Pods", "pods": {
            "metric": {"name": "tandem_num_requests_waiting"},
            "target": {"type": "AverageValue", "averageValue": "4"}}}),
        ("decode", None, {"type": "Pods", "pods": {
            "metric": {"name": "tandem_kv_cache_usage_ratio"},
            "target": {"type": "AverageValue", "averageValue": "800m"}}}),
    ],
)  # fmt: skip
def test_min_and_max_alone_render_an_hpa_on_the_roles_default(role, resources, metric):
    llmd = scaled(role, resources)
    spec = hpa(llmd, role)
    assert (spec["minReplicas"], spec["maxReplicas"], spec["metrics"]) == (1, 5, [metric])
    assert validate(llmd) == []
    assert render(with_defaults(llmd)) == render(llmd)  # the CRD's default is the operator's
    for version in ("1.30.0", f"{latest_version()}.0"):
        kubernetes_validate.validate({"apiVersion": "autoscaling/v2", "kind":
            "HorizontalPodAutoscaler", "metadata": {"name": "x"}, "spec": spec}, version,
            strict=True)  # fmt: skip


def test_a_cpu_limit_is_a_cpu_request():
    """Kubernetes copies a limit into a missing request."""
    llmd = scaled("router", {"limits": {"cpu": "1", "memory": "1Gi"}})
    assert hpa(llmd, "router")["metrics"][0]["resource"]["name"] == "cpu"
    assert validate(llmd) == []


@pytest.mark.parametrize(
    ("role", "target"),
    [("router", None), ("router", {"metric": "cpu", "value": 60}),
     ("decode", {"metric": "cpu", "value": 70})],
)  # fmt: skip
def test_a_cpu_target_without_a_cpu_request_is_refused(role, target):
    llmd = scaled(role, {"requests": {"memory": "1Gi"}}, **({"target": target} if target else {}))
    with pytest.raises(ValueError, match=rf"^spec\.autoscaling\.{role}\.target: a cpu target"):
        render(llmd)
    (error,) = validate(llmd)
    assert error.startswith(f"spec.autoscaling.{role}: a cpu target")
    assert error.endswith(f"set {role}.resources.requests.cpu")


def test_a_named_target_still_wins():
    llmd = scaled("decode", target={"metric": "requestsRunning", "value": 12})
    assert hpa(llmd, "decode")["metrics"][0]["pods"]["metric"]["name"] == (
        "tandem_num_requests_running"
    )
    assert validate(llmd) == []


def test_the_crd_refuses_a_metric_the_role_has_not():
    llmd = scaled("router", CPU, target={"metric": "kvCacheUsage", "value": 0.5})
    assert any("spec.autoscaling.router.target.metric" in e for e in validate(llmd))
