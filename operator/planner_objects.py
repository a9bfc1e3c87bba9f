"""The SLO planner's children, rendered with `spec.slo`: its ServiceAccount, Role and
RoleBinding (access.planner_rules), its NetworkPolicy and its Deployment, all named
`<name>-planner`.

The planner sizes the pools with the simulator, which imports torch; the operator stays
torch-free, so the planner runs as a pod of its own: one replica of the deployment's image
running `tandem planner --llmdeployment <name> --namespace <ns>`. It reads the resource and
the router's metrics, scales the planned pools through their Deployments' scale
subresource, and writes `status.planner`. It is a CPU pod: no GPU, no model weights loaded;
where the model sits on a claim or a host path it sees the nodes' folder read-only (for
config.json).
"""

from __future__ import annotations

import copy
from typing import Any

from tandem.operator.access import identity, planner_network_policy, planner_rules
from tandem.operator.hardening import container_security_context, pod_security_context
from tandem.operator.names import (
    MODEL_DIR,
    PLANNER_METRICS_PORT,
    child_name,
    child_object,
    labels,
    selector,
)
from tandem.operator.pods import downloads, model_volume
from tandem.operator.spec import LLMDeploymentSpec

PLANNER = "planner"
RESOURCES = {"requests": {"cpu": "100m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}}
ENV = [
    {"name": "HOME", "value": "/tmp"},
    {"name": "XDG_CACHE_HOME", "value": "/tmp/cache"},
    {"name": "HF_HOME", "value": "/tmp/huggingface"},
    {"name": "HF_HUB_OFFLINE", "value": "1"},
]


def planner_objects(spec: LLMDeploymentSpec) -> list[dict[str, Any]]:
    """The planner's identity and Deployment; none without `spec.slo`."""
    if spec.slo is None:
        return []
    return [
        *identity(spec, PLANNER, planner_rules(spec)),
        planner_network_policy(spec, PLANNER),
        planner_deployment(spec),
    ]


def planner_deployment(spec: LLMDeploymentSpec) -> dict[str, Any]:
    name = child_name(spec.name, PLANNER)
    pod_spec = {
        "serviceAccountName": name,
        "securityContext": pod_security_context(),
        "containers": [_container(spec)],
        "volumes": [{"name": "tmp", "emptyDir": {}}, *_model_volumes(spec)],
    }
    body = {
        "replicas": 1,
        "selector": {"matchLabels": selector(spec.name, PLANNER)},
        # never two planners scaling the same pools, not even during a rollout
        "strategy": {"type": "Recreate"},
        "revisionHistoryLimit": 3,
        "template": {
            "metadata": {"labels": labels(spec.name, PLANNER) | selector(spec.name, PLANNER)},
            "spec": pod_spec,
        },
    }
    return child_object("apps/v1", "Deployment", name, spec.name, PLANNER, body)


def _container(spec: LLMDeploymentSpec) -> dict[str, Any]:
    mounts = [{"name": "tmp", "mountPath": "/tmp"}]
    if _model_volumes(spec):
        mounts.append({"name": "model", "mountPath": MODEL_DIR, "readOnly": True})
    return {
        "name": PLANNER,
        "image": spec.image,
        "command": ["tandem"],
        "args": [PLANNER, "--llmdeployment", spec.name, "--namespace", spec.namespace],
        "ports": [{"name": "metrics", "containerPort": PLANNER_METRICS_PORT, "protocol": "TCP"}],
        "env": [
            _field_env("POD_NAME", "metadata.name"),
            _field_env("POD_NAMESPACE", "metadata.namespace"),
            *copy.deepcopy(ENV),
        ],
        "resources": copy.deepcopy(RESOURCES),
        "securityContext": container_security_context(),
        "volumeMounts": mounts,
        **_probes(),
    }


def _model_volumes(spec: LLMDeploymentSpec) -> list[dict[str, Any]]:
    """The nodes' model volume (a claim, the cache's claim or a host path), read-only;
    none where each node downloads its own copy."""
    return [] if downloads(spec) else [{"name": "model", **model_volume(spec)}]


def _probes() -> dict[str, Any]:
    """/health on the metrics port; the startup probe covers importing torch and the
    simulator before the server answers."""
    health = {"httpGet": {"path": "/health", "port": "metrics"}}
    return {
        "startupProbe": health | {"periodSeconds": 5, "failureThreshold": 60},
        "readinessProbe": health | {"periodSeconds": 10, "failureThreshold": 3},
        "livenessProbe": health | {"periodSeconds": 10, "failureThreshold": 6, "timeoutSeconds": 5},
    }


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}
