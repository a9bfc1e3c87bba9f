"""The pod template of each role: one hardened container running `tandem <role>`, the model
volume for the chosen source (with a download init container for Hugging Face), the engine
ConfigMap, shared memory, and probes."""

from __future__ import annotations

import copy
from typing import Any

from tandem.operator.engine_config import model_dir
from tandem.operator.names import (
    CONFIG_DIR,
    CONFIG_HASH_ANNOTATION,
    EVENTS_PORT,
    HTTP_PORT,
    MODEL_DIR,
    NIXL_PORT_RANGE,
    REVISION_LABEL,
    ZMQ_PORT,
    child_name,
    labels,
    selector,
)
from tandem.operator.spec import LLMDeploymentSpec

GPU_RESOURCE = "nvidia.com/gpu"
RUN_AS = 1000
SHM_SIZE = {"router": "256Mi", "prefill": "16Gi", "decode": "16Gi"}
# Files the router needs from a Hugging Face repo: tokenizer and config, never weights.
TOKENIZER_PATTERNS = ["*.json", "*.model", "*.txt", "*.tiktoken", "*.jinja"]
_DOWNLOAD = (
    "import sys; from huggingface_hub import snapshot_download; "
    "snapshot_download(sys.argv[1], revision=sys.argv[2], local_dir=sys.argv[3], "
    "allow_patterns=sys.argv[4:] or None)"
)


def pod_template(
    spec: LLMDeploymentSpec, role: str, revision: str, config_hash: str
) -> dict[str, Any]:
    pool = spec.pool(role)
    pod_spec: dict[str, Any] = {
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS,
            "runAsGroup": RUN_AS,
            "fsGroup": RUN_AS,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [_container(spec, role)],
        "volumes": _volumes(spec, role),
        "terminationGracePeriodSeconds": 30 if role == "router" else 60,
    }
    if role == "router":
        pod_spec["serviceAccountName"] = child_name(spec.name, "router")
    else:
        pod_spec["automountServiceAccountToken"] = False
    if (init := _download_container(spec, role)) is not None:
        pod_spec["initContainers"] = [init]
    for key, value in (
        ("nodeSelector", pool.node_selector),
        ("tolerations", pool.tolerations),
        ("affinity", pool.affinity),
    ):
        if value:
            pod_spec[key] = copy.deepcopy(value)
    return {
        "metadata": {
            "labels": labels(spec.name, role) | selector(spec.name, role)
            | {REVISION_LABEL: revision},
            "annotations": {CONFIG_HASH_ANNOTATION: config_hash},
        },
        "spec": pod_spec,
    }  # fmt: skip


def _container(spec: LLMDeploymentSpec, role: str) -> dict[str, Any]:
    return {
        "name": role,
        "image": spec.image,
        "command": ["tandem"],
        "args": [role, "--config", f"{CONFIG_DIR}/{role}.json"],
        "ports": _ports(role),
        "env": _env(spec, role),
        "resources": _resources(spec, role),
        "securityContext": _container_security(),
        "volumeMounts": _mounts(spec),
        **_probes(role),
    }


def _ports(role: str) -> list[dict[str, Any]]:
    ports = [{"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"}]
    if role == "prefill":
        ports.append({"name": "zmq", "containerPort": ZMQ_PORT, "protocol": "TCP"})
    if role != "router":
        ports.append({"name": "events", "containerPort": EVENTS_PORT, "protocol": "TCP"})
    return ports


def _env(spec: LLMDeploymentSpec, role: str) -> list[dict[str, Any]]:
    env = [
        _field_env("POD_NAME", "metadata.name"),
        _field_env("POD_NAMESPACE", "metadata.namespace"),
        {"name": "HOME", "value": "/tmp"},
        {"name": "XDG_CACHE_HOME", "value": "/tmp/cache"},
        {"name": "HF_HOME", "value": "/tmp/huggingface"},
        {"name": "HF_HUB_OFFLINE", "value": "1"},
    ]
    if role == "router":
        if (key := spec.router.api_key) is not None:
            env.append(_secret_env("TANDEM_API_KEY", key.name, key.key))
    else:
        env += [
            _field_env("TANDEM_REVISION", f"metadata.labels['{REVISION_LABEL}']"),
            {"name": "TRITON_CACHE_DIR", "value": "/tmp/triton"},
            {"name": "UCX_TCP_PORT_RANGE", "value": "{}-{}".format(*NIXL_PORT_RANGE)},
        ]
    return _merge_env(env, spec.pool(role).env)


def _merge_env(base: list[dict[str, Any]], extra: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`extra` wins over `base` by name (server-side apply refuses duplicate names)."""
    names = {item["name"] for item in extra}
    return [item for item in base if item["name"] not in names] + copy.deepcopy(extra)


def _resources(spec: LLMDeploymentSpec, role: str) -> dict[str, Any]:
    """The user's resources; prefill and decode get one GPU per tensor-parallel rank unless
    the user names a GPU count (0 removes the GPU, for CPU-only clusters)."""
    resources = copy.deepcopy(spec.pool(role).resources)
    if role == "router":
        return resources
    limits = resources.setdefault("limits", {})
    limits.setdefault(GPU_RESOURCE, spec.pool(role).tensor_parallel_size)
    if str(limits[GPU_RESOURCE]) == "0":
        del limits[GPU_RESOURCE]
        resources.get("requests", {}).pop(GPU_RESOURCE, None)
    return {key: value for key, value in resources.items() if value}


def _probes(role: str) -> dict[str, Any]:
    """Ready when /health says so (a node once its model is loaded, the router once it sees a
    decode worker); alive while the HTTP port answers, so a loading model is never killed."""

    def http() -> dict[str, Any]:
        return {"httpGet": {"path": "/health", "port": "http"}}

    def tcp() -> dict[str, Any]:
        return {"tcpSocket": {"port": "http"}}

    return {
        "startupProbe": tcp() | {"periodSeconds": 5, "failureThreshold": 120},
        "readinessProbe": http() | {"periodSeconds": 5, "failureThreshold": 2},
        "livenessProbe": tcp() | {"periodSeconds": 10, "failureThreshold": 6},
    }


def _container_security() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def _mounts(spec: LLMDeploymentSpec) -> list[dict[str, Any]]:
    downloaded = spec.model.source.kind == "huggingFace"  # written by the init container
    return [
        {"name": "model", "mountPath": MODEL_DIR, "readOnly": not downloaded},
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "shm", "mountPath": "/dev/shm"},
    ]  # fmt: skip


def _volumes(spec: LLMDeploymentSpec, role: str) -> list[dict[str, Any]]:
    return [
        {"name": "model", **_model_volume(spec)},
        {"name": "config", "configMap": {"name": child_name(spec.name, "config")}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE[role]}},
    ]


def _model_volume(spec: LLMDeploymentSpec) -> dict[str, Any]:
    source = spec.model.source
    if source.kind == "pvc":
        return {"persistentVolumeClaim": {"claimName": source.claim_name, "readOnly": True}}
    if source.kind == "hostPath":
        return {"hostPath": {"path": source.path, "type": "Directory"}}
    return {"emptyDir": {}}


def _download_container(spec: LLMDeploymentSpec, role: str) -> dict[str, Any] | None:
    source = spec.model.source
    if source.kind != "huggingFace":
        return None
    patterns = TOKENIZER_PATTERNS if role == "router" else []
    env = [{"name": "HOME", "value": "/tmp"}, {"name": "HF_HOME", "value": "/tmp/huggingface"}]
    if source.token is not None:
        env.append(_secret_env("HF_TOKEN", source.token.name, source.token.key))
    return {
        "name": "download",
        "image": spec.image,
        "command": ["python", "-c", _DOWNLOAD],
        "args": [source.repo, source.revision, model_dir(spec), *patterns],
        "env": env,
        "securityContext": _container_security(),
        "volumeMounts": [
            {"name": "model", "mountPath": MODEL_DIR},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _secret_env(name: str, secret: str, key: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
