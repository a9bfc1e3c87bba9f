"""Names, labels and ports shared by every child of one LLMDeployment. The router finds
its workers through these labels (`tandem.dev/role` on each Service, copied by Kubernetes
onto its EndpointSlices) and port names (`http`), so they are defined once, here; and the
PodMonitor scrapes each pod's `metrics` port (the router's `http`)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

GROUP = "tandem.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "LLMDeployment"
PLURAL = "llmdeployments"
FIELD_MANAGER = "tandem-operator"

DEPLOYMENT_LABEL = "tandem.dev/deployment"
ROLE_LABEL = "tandem.dev/role"
REVISION_LABEL = "tandem.dev/revision"
CONFIG_HASH_ANNOTATION = "tandem.dev/config-hash"
RESERVED_PREFIX = f"{GROUP}/"  # labels and annotations under it are the operator's
# Components with pods of their own, named by ROLE_LABEL: the three roles and the SLO planner.
LABELLED_ROLES = ("router", "prefill", "decode", "planner")

HTTP_PORT = 8000  # the router's public API; a node's control API (the router's only)
METRICS_PORT = 8001  # prefill and decode: /metrics and the probes' /health, /health/live
ZMQ_PORT = 5557  # prefill: ROUTER socket taking prefill requests from decode pods
EVENTS_PORT = 5558  # prefill and decode: PUB socket of KV events and load
PLANNER_METRICS_PORT = 9090  # the SLO planner: /metrics and its probes' /health
# UCX picks its TCP listening ports from this range (UCX_TCP_PORT_RANGE), so that the
# NetworkPolicy can open NIXL's data path between nodes and nothing else.
NIXL_PORT_RANGE = (20000, 20999)
CONFIG_DIR = "/etc/tandem"
MODEL_DIR = "/models"
# Volume name -> mount path in every role's container; a pod template may add others.
POD_VOLUMES = {"model": MODEL_DIR, "config": CONFIG_DIR, "tmp": "/tmp", "shm": "/dev/shm"}
# The volume holding a pool's KV disk tier (kv_tiers.py), where it has one.
KV_DISK_VOLUME = "kv-disk"
KV_DISK_DIR = "/var/lib/tandem/kv-disk"
# Volume names and mount paths a pod template may not take.
RESERVED_VOLUMES = POD_VOLUMES | {KV_DISK_VOLUME: KV_DISK_DIR}
DOWNLOAD_CONTAINER = "download"  # the init container fetching a Hugging Face model


def child_name(deployment: str, role: str) -> str:
    return f"{deployment}-{role}"


TOKEN_KEY = "token"  # the key of the deployment's token in its Secret


def token_secret_name(deployment: str) -> str:
    """The Secret holding the deployment's token (operator/token_secret.py)."""
    return child_name(deployment, "token")


def selector(deployment: str, role: str) -> dict[str, str]:
    """The immutable label selector of one role's pods (never includes the revision)."""
    return {DEPLOYMENT_LABEL: deployment, ROLE_LABEL: role}


def labels(deployment: str, component: str) -> dict[str, str]:
    """Labels on every child object; `component` is a role or a shared part."""
    return {
        "app.kubernetes.io/name": "tandem",
        "app.kubernetes.io/instance": deployment,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": FIELD_MANAGER,
        DEPLOYMENT_LABEL: deployment,
        **({ROLE_LABEL: component} if component in LABELLED_ROLES else {}),
    }


def child_object(
    api_version: str, kind: str, name: str, deployment: str, component: str, body: dict[str, Any]
) -> dict[str, Any]:
    """A child object of `deployment`: its name, the labels of `component`, and `body` as
    its spec."""
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": name, "labels": labels(deployment, component)},
        "spec": body,
    }


def short_hash(value: Any) -> str:
    """A stable 10-hex-digit digest of a JSON-serialisable value."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:10]
