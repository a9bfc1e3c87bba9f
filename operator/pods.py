"""The pod template of each role: one hardened container running `tandem <role>`, the model
volume for the chosen source (a download init container for Hugging Face, unless the model
cache's claim holds it), the engine ConfigMap, shared memory, probes, the pool's KV tiers
(kv_tiers.py), and what the role's `podTemplate` adds (pod_overrides.py)."""

from __future__ import annotations

import copy
import math
from typing import Any

from tandem.engine.api.deployment_token import ENV as TOKEN_ENV
from tandem.operator.download import TOKENIZER_PATTERNS, download_container
from tandem.operator.engine_config import model_dir
from tandem.operator.hardening import container_security_context, pod_security_context
from tandem.operator.kv_tiers import (
    add_kv_tier_resources,
    kv_tier_args,
    kv_tier_mounts,
    kv_tier_volumes,
)
from tandem.operator.model_cache import claim_name
from tandem.operator.names import (
    CONFIG_DIR,
    CONFIG_HASH_ANNOTATION,
    EVENTS_PORT,
    HTTP_PORT,
    METRICS_PORT,
    NIXL_PORT_RANGE,
    POD_VOLUMES,
    REVISION_LABEL,
    TOKEN_KEY,
    ZMQ_PORT,
    child_name,
    labels,
    selector,
    token_secret_name,
)
from tandem.operator.pod_overrides import PodOverrides
from tandem.operator.spec import LLMDeploymentSpec, RoleSpec

GPU_RESOURCE = "nvidia.com/gpu"
SHM_SIZE = {"router": "256Mi", "prefill": "16Gi", "decode": "16Gi"}
# Seconds a deleted pod keeps serving before its SIGTERM (preStop), while its endpoint's
# removal reaches whoever sends it requests: for a node, the router, whose discovery lists
# EndpointSlices every 5 s and then checks health (1 s; `tandem router`'s defaults); for the
# router, kube-proxy and the ingress in front of its Service. After SIGTERM the servers
# finish their open requests within the grace period, the same for every role: a router's
# stream lasts as long as the decode pod's behind it (a pod that is done exits sooner).
DRAIN_S = {"router": 5, "prefill": 10, "decode": 10}
GRACE_S = 120
MAX_GRACE_S = 3600  # a grace past an hour is a misconfiguration, not a request to wait for


def grace_seconds(spec: LLMDeploymentSpec) -> int:
    """Seconds a pod has after SIGTERM to finish what it holds. With `spec.slo` and a
    `maxModelLen`, the longest request allowed ends within its TTFT target plus
    `maxModelLen` tokens at its TPOT target, so a scale-down cuts none within the SLO:
    the grace is at least that (and GRACE_S, at most MAX_GRACE_S)."""
    slo, max_len = spec.slo, spec.model.max_model_len
    if slo is None or max_len is None:
        return GRACE_S
    longest = math.ceil(slo.ttft_s + max_len * slo.tpot_s)
    return min(MAX_GRACE_S, max(GRACE_S, longest))


def pod_template(
    spec: LLMDeploymentSpec, role: str, revision: str, config_hash: str
) -> dict[str, Any]:
    pool = spec.pool(role)
    extra = copy.deepcopy(pool.pod)
    pod_spec: dict[str, Any] = {
        "securityContext": pod_security_context(),
        "containers": [_container(spec, role), *extra.containers],
        "volumes": _volumes(spec, role) + extra.volumes,
        "terminationGracePeriodSeconds": grace_seconds(spec),
    }
    if role == "router":
        pod_spec["serviceAccountName"] = child_name(spec.name, "router")
    else:
        pod_spec["automountServiceAccountToken"] = False
    # The platform's init containers first: a native sidecar (a proxy) serves the download.
    if init := [*extra.init_containers, *_download_containers(spec, role)]:
        pod_spec["initContainers"] = init
    pod_spec |= _placement(pool, extra)
    return {
        "metadata": {
            "labels": labels(spec.name, role) | selector(spec.name, role)
            | {REVISION_LABEL: revision} | extra.labels,
            "annotations": {CONFIG_HASH_ANNOTATION: config_hash} | extra.annotations,
        },
        "spec": pod_spec,
    }  # fmt: skip


def _placement(pool: RoleSpec, extra: PodOverrides) -> dict[str, Any]:
    """Where and how the pods are scheduled and run: only the fields that are set."""
    fields = {
        "nodeSelector": pool.node_selector,
        "tolerations": pool.tolerations,
        "affinity": pool.affinity,
        "schedulerName": extra.scheduler_name,
        "priorityClassName": extra.priority_class_name,
        "runtimeClassName": extra.runtime_class_name,
    }
    return {key: copy.deepcopy(value) for key, value in fields.items() if value}


def _container(spec: LLMDeploymentSpec, role: str) -> dict[str, Any]:
    return {
        "name": role,
        "image": spec.image,
        "command": ["tandem"],
        "args": [role, "--config", f"{CONFIG_DIR}/{role}.json", *_kv_args(spec, role)],
        "ports": _ports(role),
        "env": _env(spec, role),
        "resources": _resources(spec, role),
        "securityContext": _container_security(spec.pool(role).pod),
        "volumeMounts": _mounts(spec, role),
        **_probes(role),
        "lifecycle": {"preStop": {"sleep": {"seconds": DRAIN_S[role]}}},
    }


def _kv_args(spec: LLMDeploymentSpec, role: str) -> list[str]:
    """The KV tiers' flags, on the command line rather than in the shared ConfigMap: a
    pool's tiers then roll that pool alone."""
    return kv_tier_args(spec.pool(role).kv_tiers)


def _ports(role: str) -> list[dict[str, Any]]:
    ports = [{"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"}]
    if role != "router":
        ports.append({"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"})
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
        _secret_env(TOKEN_ENV, token_secret_name(spec.name), TOKEN_KEY),
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
    the user names a GPU count (0 removes the GPU, for CPU-only clusters), and the memory
    and ephemeral storage of their KV tiers."""
    resources = copy.deepcopy(spec.pool(role).resources)
    if role == "router":
        return resources
    add_kv_tier_resources(resources, spec.pool(role).kv_tiers)
    limits = resources.setdefault("limits", {})
    limits.setdefault(GPU_RESOURCE, spec.pool(role).tensor_parallel_size)
    if str(limits[GPU_RESOURCE]) == "0":
        del limits[GPU_RESOURCE]
        resources.get("requests", {}).pop(GPU_RESOURCE, None)
    return {key: value for key, value in resources.items() if value}


def _probes(role: str) -> dict[str, Any]:
    """Ready when /health says so (a node once its model is loaded and while its engine
    loop turns, the router once it has seen a healthy decode worker, and from then on). A
    node is alive while /health/live says so (loading, or the engine loop turned within its
    stall bound), the router while its HTTP port answers. The startup probe is TCP, so a
    loading model is never killed. A node is probed on its metrics port, served by a thread
    of its own; the router on its one port."""
    port = "http" if role == "router" else "metrics"

    def http(path: str) -> dict[str, Any]:
        return {"httpGet": {"path": path, "port": port}}

    def tcp() -> dict[str, Any]:
        return {"tcpSocket": {"port": port}}

    # a node's event loop may answer late while its engine thread is busy: 5 s, not 1
    live = tcp() if role == "router" else http("/health/live") | {"timeoutSeconds": 5}
    return {
        "startupProbe": tcp() | {"periodSeconds": 5, "failureThreshold": 120},
        "readinessProbe": http("/health") | {"periodSeconds": 5, "failureThreshold": 2},
        "livenessProbe": live | {"periodSeconds": 10, "failureThreshold": 6},
    }


def _container_security(extra: PodOverrides) -> dict[str, Any]:
    return container_security_context(extra.capabilities, extra.security)


def _mounts(spec: LLMDeploymentSpec, role: str) -> list[dict[str, Any]]:
    read_only = {"model": not downloads(spec), "config": True}  # the init container writes
    mounts = []
    for name, path in POD_VOLUMES.items():
        mount = {"name": name, "mountPath": path}
        if name in read_only:
            mount["readOnly"] = read_only[name]
        mounts.append(mount)
    pool = spec.pool(role)
    return mounts + kv_tier_mounts(pool.kv_tiers) + copy.deepcopy(pool.pod.volume_mounts)


def _volumes(spec: LLMDeploymentSpec, role: str) -> list[dict[str, Any]]:
    return [
        {"name": "model", **model_volume(spec)},
        {"name": "config", "configMap": {"name": child_name(spec.name, "config")}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE[role]}},
        *kv_tier_volumes(spec.pool(role).kv_tiers),
    ]


def model_volume(spec: LLMDeploymentSpec) -> dict[str, Any]:
    """The model's volume source in every pod that reads it (an emptyDir each pod downloads
    into, where `downloads(spec)`)."""
    source = spec.model.source
    if source.kind == "pvc":
        return {"persistentVolumeClaim": {"claimName": source.claim_name, "readOnly": True}}
    if source.kind == "hostPath":
        return {"hostPath": {"path": source.path, "type": "Directory"}}
    if spec.model.cache is not None:
        return {"persistentVolumeClaim": {"claimName": claim_name(spec), "readOnly": True}}
    return {"emptyDir": {}}


def downloads(spec: LLMDeploymentSpec) -> bool:
    """Each pod downloads its own copy: a Hugging Face model without a cache."""
    return spec.model.source.kind == "huggingFace" and spec.model.cache is None


def _download_containers(spec: LLMDeploymentSpec, role: str) -> list[dict[str, Any]]:
    if not downloads(spec):
        return []
    patterns = TOKENIZER_PATTERNS if role == "router" else ()
    return [download_container(spec.model.source, spec.image, model_dir(spec), patterns)]


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _secret_env(name: str, secret: str, key: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
