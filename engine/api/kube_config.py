"""Kubernetes client configuration shared by the router's discovery and the operator."""

from __future__ import annotations

import os
from typing import Any


def load_configuration() -> Any:
    """A `kubernetes.client.Configuration` of its own (the client's global default is left
    alone): the in-cluster service account, else $KUBECONFIG read now (the client reads it
    once, at import) or ~/.kube/config."""
    from kubernetes import client, config

    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        config.load_kube_config(
            config_file=os.environ.get("KUBECONFIG"), client_configuration=configuration
        )
    return configuration
