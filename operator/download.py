"""The container that downloads a Hugging Face model with `huggingface_hub`, from the
serving image: an init container of each pod (into its own emptyDir), or the one container
of the model cache's Job (into the shared claim)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tandem.operator.hardening import container_security_context
from tandem.operator.names import DOWNLOAD_CONTAINER, MODEL_DIR
from tandem.operator.spec import ModelSource

# Files the router needs from a Hugging Face repo: tokenizer and config, never weights.
TOKENIZER_PATTERNS = ("*.json", "*.model", "*.txt", "*.tiktoken", "*.jinja")
_DOWNLOAD = (
    "import sys; from huggingface_hub import snapshot_download; "
    "snapshot_download(sys.argv[1], revision=sys.argv[2], local_dir=sys.argv[3], "
    "allow_patterns=sys.argv[4:] or None)"
)


def download_container(
    source: ModelSource, image: str, target: str, patterns: Sequence[str] = ()
) -> dict[str, Any]:
    """Download `source` into `target`, a folder under the `model` volume (mounted at
    MODEL_DIR, writable), keeping only files matching `patterns` when given."""
    env = [{"name": "HOME", "value": "/tmp"}, {"name": "HF_HOME", "value": "/tmp/huggingface"}]
    if source.token is not None:
        secret = {"name": source.token.name, "key": source.token.key}
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": secret}})
    return {
        "name": DOWNLOAD_CONTAINER,
        "image": image,
        "command": ["python", "-c", _DOWNLOAD],
        "args": [source.repo, source.revision, target, *patterns],
        "env": env,
        "securityContext": container_security_context(),
        "volumeMounts": [
            {"name": "model", "mountPath": MODEL_DIR},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
