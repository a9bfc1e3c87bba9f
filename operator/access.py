"""Who may do what: the router's ServiceAccount with the one permission its discovery
uses (list EndpointSlices), the SLO planner's with what it reads and scales, the
NetworkPolicy that opens the nodes' ports only to the pods that need them, and the
planner's, which lets in only the scrapers."""

from __future__ import annotations

from typing import Any

from tandem.operator.names import (
    DEPLOYMENT_LABEL,
    EVENTS_PORT,
    GROUP,
    HTTP_PORT,
    METRICS_PORT,
    NIXL_PORT_RANGE,
    PLANNER_METRICS_PORT,
    PLURAL,
    ROLE_LABEL,
    ZMQ_PORT,
    child_name,
    labels,
    selector,
)
from tandem.operator.slo import PLANNED_ROLES
from tandem.operator.spec import LLMDeploymentSpec

ROUTER_RULES = [
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list"]}
]


def router_identity(spec: LLMDeploymentSpec) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding, all named `<name>-router`."""
    return identity(spec, "router", ROUTER_RULES)


def planner_rules(spec: LLMDeploymentSpec) -> list[dict[str, Any]]:
    """The SLO planner's rights, no more: read the LLMDeployments (it watches its own) and
    write its own one's status (`status.planner`); read both pools' Deployments and scale
    only the pools it plans; find the router pods (list pods, for their IPs); post Events."""
    pools = [child_name(spec.name, role) for role in PLANNED_ROLES]
    planned = [child_name(spec.name, role) for role in PLANNED_ROLES if spec.planned(role)]
    assert planned, "spec.slo plans a pool: no resourceNames would grant every Deployment"
    status = {"resourceNames": [spec.name]}
    return [
        {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [GROUP], "resources": [f"{PLURAL}/status"],
         "verbs": ["get", "patch", "update"]} | status,
        {"apiGroups": ["apps"], "resources": ["deployments", "deployments/scale"],
         "verbs": ["get"], "resourceNames": pools},
        {"apiGroups": ["apps"], "resources": ["deployments/scale"], "verbs": ["patch", "update"],
         "resourceNames": planned},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
        {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
    ]  # fmt: skip


def identity(
    spec: LLMDeploymentSpec, component: str, rules: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """ServiceAccount, Role (granting `rules`) and RoleBinding, all named
    `<name>-<component>`."""
    name = child_name(spec.name, component)
    meta = {"name": name, "labels": labels(spec.name, component)}
    subject = {"kind": "ServiceAccount", "name": name, "namespace": spec.namespace}
    role_ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}
    rbac = "rbac.authorization.k8s.io/v1"
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": dict(meta)},
        {"apiVersion": rbac, "kind": "Role", "metadata": dict(meta), "rules": rules},
        {
            "apiVersion": rbac,
            "kind": "RoleBinding",
            "metadata": dict(meta),
            "subjects": [subject],
            "roleRef": role_ref,
        },
    ]


def node_network_policy(spec: LLMDeploymentSpec) -> dict[str, Any]:
    """Ingress to prefill and decode pods: the control API (HTTP) and KV events from the
    router; ZMQ, KV events and NIXL (UCX's TCP port range) from each other; the metrics
    port (/metrics, /health, /health/live), and only it, from the scraper's namespace when
    a PodMonitor is rendered. Everything else is dropped (docs/security.md "Ports")."""
    tcp = "TCP"
    low, high = NIXL_PORT_RANGE
    ingress = [
        {
            "from": [{"podSelector": {"matchLabels": selector(spec.name, "router")}}],
            "ports": [{"protocol": tcp, "port": HTTP_PORT}, {"protocol": tcp, "port": EVENTS_PORT}],
        },
        {
            "from": [{"podSelector": _nodes(spec)}],
            "ports": [
                {"protocol": tcp, "port": ZMQ_PORT},
                {"protocol": tcp, "port": EVENTS_PORT},
                {"protocol": tcp, "port": low, "endPort": high},
            ],
        },
    ]
    ingress += _scrapers(spec, METRICS_PORT)
    return _ingress_policy(spec, "nodes", _nodes(spec), ingress)


def planner_network_policy(spec: LLMDeploymentSpec, component: str) -> dict[str, Any]:
    """Ingress to the SLO planner's pod: its metrics port from the scraper's namespace when
    a PodMonitor is rendered, nothing else (it serves nobody; the kubelet's probes come from
    the node, which a NetworkPolicy always lets in). Its egress, to the API server and the
    routers, stays open."""
    pods = {"matchLabels": selector(spec.name, component)}
    return _ingress_policy(spec, component, pods, _scrapers(spec, PLANNER_METRICS_PORT))


def _scrapers(spec: LLMDeploymentSpec, port: int) -> list[dict[str, Any]]:
    if spec.pod_monitor is None:
        return []
    namespace = {"kubernetes.io/metadata.name": spec.pod_monitor.scraper_namespace}
    return [
        {
            "from": [{"namespaceSelector": {"matchLabels": namespace}}],
            "ports": [{"protocol": "TCP", "port": port}],
        }
    ]


def _ingress_policy(
    spec: LLMDeploymentSpec, component: str, pods: dict[str, Any], ingress: list[dict[str, Any]]
) -> dict[str, Any]:
    name, meta = child_name(spec.name, component), labels(spec.name, component)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "labels": meta},
        "spec": {"podSelector": pods, "policyTypes": ["Ingress"], "ingress": ingress},
    }


def _nodes(spec: LLMDeploymentSpec) -> dict[str, Any]:
    return {
        "matchLabels": {DEPLOYMENT_LABEL: spec.name},
        "matchExpressions": [
            {"key": ROLE_LABEL, "operator": "In", "values": ["prefill", "decode"]}
        ],
    }
