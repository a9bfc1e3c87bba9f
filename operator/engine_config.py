"""What each role's process is told: the flags in the ConfigMap's `<role>.json` (read by
`tandem <role> --config FILE`), and the revision, a hash of everything that makes two
engines incompatible (a decode node only takes KV blocks from a prefill node of its own
revision)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from tandem.operator.names import (
    DEPLOYMENT_LABEL,
    EVENTS_PORT,
    HTTP_PORT,
    METRICS_PORT,
    MODEL_DIR,
    ZMQ_PORT,
    short_hash,
)
from tandem.operator.spec import LLMDeploymentSpec


def model_dir(spec: LLMDeploymentSpec) -> str:
    """Where the model folder is inside every pod."""
    source = spec.model.source
    if source.kind == "pvc":
        return f"{MODEL_DIR}/{source.path.strip('/')}".rstrip("/")
    if source.kind == "hostPath":
        return MODEL_DIR
    if spec.model.cache is not None:
        return f"{MODEL_DIR}/{cache_folder(spec)}"
    return f"{MODEL_DIR}/model"


def cache_folder(spec: LLMDeploymentSpec) -> str:
    """The model's folder inside the cache claim: one per repo and revision, so a claim
    holds several models, and pods of the previous revision keep reading theirs while a
    new one downloads."""
    source = spec.model.source
    return f"huggingface/{source.repo}/{source.revision.replace('/', '--')}"


def revision(spec: LLMDeploymentSpec) -> str:
    """Changes exactly when the engines' weights, numerics or KV layout change."""
    return short_hash(
        {
            "model": {
                "source": asdict(spec.model.source) | {"token": None},
                "dtype": spec.model.dtype,
                "maxModelLen": spec.model.max_model_len,
            },
            "image": spec.image,
            "engine": asdict(spec.engine),
            "tensorParallelSize": [
                spec.prefill.tensor_parallel_size,
                spec.decode.tensor_parallel_size,
            ],
        }
    )


def role_flags(spec: LLMDeploymentSpec, role: str) -> dict[str, Any]:
    """Flag name (without dashes) -> value for `tandem <role>`."""
    if role == "router":
        return _router_flags(spec)
    flags = _engine_flags(spec) | {"tensor-parallel-size": spec.pool(role).tensor_parallel_size}
    if role == "prefill":
        # the decode pool's size: a finer split of the KV heads needs staging mirrors,
        # planned at start-up (engine/transfer/kv_staging.py)
        peers = [spec.decode.tensor_parallel_size]
        return flags | {
            "zmq-port": ZMQ_PORT,
            "events-port": EVENTS_PORT,
            "peer-tensor-parallel-sizes": peers,
        }
    return flags | {
        "zmq-port": EVENTS_PORT,  # a decode node's only socket is its PUB of KV events
        "remote-prefill-threshold": spec.remote_prefill_threshold,
        "on-prefill-failure": spec.on_prefill_failure,
    }


def config_data(spec: LLMDeploymentSpec, roles: list[str]) -> dict[str, str]:
    """The ConfigMap's data: one `<role>.json` per rendered role."""
    return {
        f"{role}.json": json.dumps(role_flags(spec, role), indent=2, sort_keys=True) + "\n"
        for role in roles
    }


def _common(spec: LLMDeploymentSpec) -> dict[str, Any]:
    flags = {
        "model": model_dir(spec),
        "served-model-name": spec.model.name,
        "host": "0.0.0.0",
        "block-size": spec.engine.block_size,
    }
    if spec.model.max_model_len is not None:
        flags["max-model-len"] = spec.model.max_model_len
    return flags


def _engine_flags(spec: LLMDeploymentSpec) -> dict[str, Any]:
    engine = spec.engine
    return _common(spec) | {
        "http-port": HTTP_PORT,
        "metrics-port": METRICS_PORT,
        "dtype": spec.model.dtype,
        "max-num-batched-tokens": engine.max_num_batched_tokens,
        "max-num-seqs": engine.max_num_seqs,
        "gpu-memory-utilization": engine.gpu_memory_utilization,
        "no-prefix-caching": not engine.enable_prefix_caching,
    }


def _router_flags(spec: LLMDeploymentSpec) -> dict[str, Any]:
    return _common(spec) | {
        "port": HTTP_PORT,
        "policy": spec.router.policy,
        "tool-call-parser": spec.router.tool_call_parser,
        "discovery": "kubernetes",
        "selector": f"{DEPLOYMENT_LABEL}={spec.name}",
    }
