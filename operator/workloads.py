"""Per-role children: the Deployment, its Service, PodDisruptionBudget and, when the role
autoscales, its HorizontalPodAutoscaler (which then owns the Deployment's replica count, as
the SLO planner owns a planned pool's)."""

from __future__ import annotations

from typing import Any

from tandem.operator.names import (
    EVENTS_PORT,
    HTTP_PORT,
    ZMQ_PORT,
    child_name,
    child_object,
    selector,
)
from tandem.operator.pods import pod_template
from tandem.operator.scaling import Scaling
from tandem.operator.spec import LLMDeploymentSpec

# Per-pod averages a custom-metrics adapter serves from the pods' own Prometheus metrics.
POD_METRICS = {
    ("router", "requestsRunning"): "tandem_router_requests_in_flight",
    ("prefill", "requestsWaiting"): "tandem_num_requests_waiting",
    ("prefill", "requestsRunning"): "tandem_num_requests_running",
    ("prefill", "kvCacheUsage"): "tandem_kv_cache_usage_ratio",
    ("decode", "requestsWaiting"): "tandem_num_requests_waiting",
    ("decode", "requestsRunning"): "tandem_num_requests_running",
    ("decode", "kvCacheUsage"): "tandem_kv_cache_usage_ratio",
}


def deployment(
    spec: LLMDeploymentSpec, role: str, revision: str, config_hash: str
) -> dict[str, Any]:
    pool = spec.pool(role)
    body: dict[str, Any] = {
        "selector": {"matchLabels": selector(spec.name, role)},
        # One pod more, never one fewer: a rollout keeps the pool's full capacity.
        "strategy": {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
        },
        "revisionHistoryLimit": 3,
        "template": pod_template(spec, role, revision, config_hash),
    }
    # with an HPA or the SLO planner the count is theirs, not ours (replica_handover.py)
    if pool.scaling is None and spec.planned(role) is None:
        body = {"replicas": pool.replicas, **body}
    return _object("apps/v1", "Deployment", spec, role, body)


def service(spec: LLMDeploymentSpec, role: str) -> dict[str, Any]:
    if role == "router":
        port = {"name": "http", "port": spec.router.service_port, "targetPort": "http"}
        body = {"type": spec.router.service_type, "ports": [port | {"protocol": "TCP"}]}
    else:
        # Headless: the router and the decode pods address each pod, not a virtual IP.
        body = {"clusterIP": "None", "ports": _node_ports(role)}
    body["selector"] = selector(spec.name, role)
    return _object("v1", "Service", spec, role, body)


def disruption_budget(spec: LLMDeploymentSpec, role: str) -> dict[str, Any]:
    body = {"maxUnavailable": 1, "selector": {"matchLabels": selector(spec.name, role)}}
    return _object("policy/v1", "PodDisruptionBudget", spec, role, body)


def autoscaler(spec: LLMDeploymentSpec, role: str, scaling: Scaling) -> dict[str, Any]:
    body = {
        "scaleTargetRef": {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": child_name(spec.name, role),
        },
        "minReplicas": scaling.min_replicas,
        "maxReplicas": scaling.max_replicas,
        "metrics": [_metric(role, scaling)],
    }
    return _object("autoscaling/v2", "HorizontalPodAutoscaler", spec, role, body)


def _metric(role: str, scaling: Scaling) -> dict[str, Any]:
    if scaling.metric == "cpu":
        target = {"type": "Utilization", "averageUtilization": round(scaling.value)}
        return {"type": "Resource", "resource": {"name": "cpu", "target": target}}
    name = POD_METRICS[(role, scaling.metric)]  # spec.parse allows only these pairs
    target = {"type": "AverageValue", "averageValue": _quantity(scaling.value)}
    return {"type": "Pods", "pods": {"metric": {"name": name}, "target": target}}


def _quantity(value: float) -> str:
    """A Kubernetes quantity: whole numbers as is, fractions in thousandths (0.8 -> 800m)."""
    if value == int(value):
        return str(int(value))
    return f"{round(value * 1000)}m"


def _node_ports(role: str) -> list[dict[str, Any]]:
    ports = [("http", HTTP_PORT), ("events", EVENTS_PORT)]
    if role == "prefill":
        ports.append(("zmq", ZMQ_PORT))
    return [
        {"name": name, "port": port, "targetPort": name, "protocol": "TCP"} for name, port in ports
    ]


def _object(
    api_version: str, kind: str, spec: LLMDeploymentSpec, role: str, body: dict[str, Any]
) -> dict[str, Any]:
    return child_object(api_version, kind, child_name(spec.name, role), spec.name, role, body)
