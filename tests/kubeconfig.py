"""A kubeconfig pointing the official client at a local test server."""

from __future__ import annotations

import json
from pathlib import Path


def write_kubeconfig(folder: Path, server_url: str, token: str) -> Path:
    """Write `folder/config` for `server_url` with a bearer `token`; returns its path."""
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "c", "cluster": {"server": server_url}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "test", "context": {"cluster": "c", "user": "u"}}],
    }  # fmt: skip
    path = folder / "config"
    path.write_text(json.dumps(config))
    return path
