"""`render(llmd) -> objects`: every child of one LLMDeployment, pure and deterministic.

No Kubernetes client is imported here: the reconcile applies what this returns, the tests
compare it with golden files, and `tandem operator --render FILE` prints it.
"""

from __future__ import annotations

from typing import Any

from tandem.operator.access import node_network_policy, router_identity
from tandem.operator.engine_config import config_data, revision
from tandem.operator.model_cache import cache_objects
from tandem.operator.names import (
    API_VERSION,
    DEPLOYMENT_LABEL,
    KIND,
    ROLE_LABEL,
    child_name,
    labels,
    short_hash,
)
from tandem.operator.planner_objects import planner_objects
from tandem.operator.spec import LLMDeploymentSpec, parse
from tandem.operator.workloads import autoscaler, deployment, disruption_budget, service


def render(llmd: dict[str, Any]) -> list[dict[str, Any]]:
    """Every child object, namespaced and owned by `llmd` (when it carries a uid).

    Raises ValueError naming the field (`spec.decode.replicas: ...`) for an invalid spec;
    nothing is rendered then, so nothing is changed.
    """
    return render_spec(parse(llmd))


def render_spec(spec: LLMDeploymentSpec) -> list[dict[str, Any]]:
    """render() of an already parsed spec; never raises."""
    roles = active_roles(spec)
    config = config_data(spec, roles)
    rev = revision(spec)
    objects = [
        _config_map(spec, config),
        *cache_objects(spec),
        *router_identity(spec),
        node_network_policy(spec),
    ]
    for role in roles:
        # a role's pods roll when its own file changes, not another role's (the planner's
        # remote-prefill threshold is the decode pool's alone)
        objects += _role_objects(spec, role, rev, short_hash(config[f"{role}.json"]))
    objects += planner_objects(spec)
    if spec.pod_monitor is not None:
        objects.append(_pod_monitor(spec))
    return [owned(obj, spec) for obj in objects]


def active_roles(spec: LLMDeploymentSpec) -> list[str]:
    """Roles with pods: prefill is left out at 0 replicas (decode then prefills locally),
    unless an HPA or the SLO planner sizes it."""
    scaled = spec.prefill.scaling is not None or spec.planned("prefill") is not None
    prefill = spec.prefill.replicas > 0 or scaled
    return ["router", *(["prefill"] if prefill else []), "decode"]


def _role_objects(
    spec: LLMDeploymentSpec, role: str, rev: str, config_hash: str
) -> list[dict[str, Any]]:
    objects = [
        deployment(spec, role, rev, config_hash),
        service(spec, role),
        disruption_budget(spec, role),
    ]
    if (scaling := spec.pool(role).scaling) is not None:
        objects.append(autoscaler(spec, role, scaling))
    return objects


def _config_map(spec: LLMDeploymentSpec, data: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": child_name(spec.name, "config"),
            "labels": labels(spec.name, "config"),
        },
        "data": data,
    }


def _pod_monitor(spec: LLMDeploymentSpec) -> dict[str, Any]:
    monitor = spec.pod_monitor
    nodes = {"port": "metrics", "path": "/metrics", "interval": monitor.interval}
    # The router serves /metrics on its one port, `http`; the nodes' `http` port (their
    # control API) serves none, and the NetworkPolicy closes it to the scrapers.
    only_router = {
        "action": "keep",
        "sourceLabels": [f"__meta_kubernetes_pod_label_{_label_name(ROLE_LABEL)}"],
        "regex": "router",
    }
    router = nodes | {"port": "http", "relabelings": [only_router]}
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {
            "name": spec.name,
            "labels": labels(spec.name, "monitoring") | monitor.labels,
        },
        "spec": {
            "selector": {"matchLabels": {DEPLOYMENT_LABEL: spec.name}},
            # on every series and on `up` (tandem_dev_deployment, tandem_dev_role): the
            # dashboards count a deployment's targets that are down by them
            "podTargetLabels": [DEPLOYMENT_LABEL, ROLE_LABEL],
            "podMetricsEndpoints": [nodes, router],
        },
    }


def _label_name(label: str) -> str:
    """A Kubernetes label as Prometheus's service discovery names it (`tandem.dev/role` ->
    `tandem_dev_role`)."""
    return "".join(c if c.isalnum() else "_" for c in label)


def owned(obj: dict[str, Any], spec: LLMDeploymentSpec) -> dict[str, Any]:
    """`obj` in the resource's namespace, controlled by it (deleted with it)."""
    meta = obj["metadata"] = {
        "name": obj["metadata"]["name"], "namespace": spec.namespace, **obj["metadata"]
    }  # fmt: skip
    if spec.uid:
        meta["ownerReferences"] = [
            {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": spec.name,
                "uid": spec.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    return obj
