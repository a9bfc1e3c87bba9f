"""The deployment's token (`engine.api.deployment_token`) in the Secret `<name>-token`: made
once by the operator with a random value, and never read or changed by it. Every pod of the
deployment reads it through a `secretKeyRef`; the operator holds only `create` on Secrets,
so it can read no Secret anywhere. Deleting the Secret rotates the token: the next
reconcile makes a new one, which pods take when they restart (`kubectl rollout restart`
both pools and the router: nodes with different tokens refuse to pair)."""

from __future__ import annotations

import secrets
from typing import Any

from tandem.operator.kinds import SECRET
from tandem.operator.kube import ApiError
from tandem.operator.names import TOKEN_KEY, labels, token_secret_name
from tandem.operator.render import owned
from tandem.operator.spec import LLMDeploymentSpec


def token_secret(spec: LLMDeploymentSpec) -> dict[str, Any]:
    """A new Secret with a new random token (256 bits)."""
    meta = {"name": token_secret_name(spec.name), "labels": labels(spec.name, "token")}
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "Opaque"}
    secret["stringData"] = {TOKEN_KEY: secrets.token_urlsafe(32)}
    return owned(secret, spec)


def ensure_token_secret(api: Any, spec: LLMDeploymentSpec) -> bool:
    """Create the Secret unless it exists (409, left as it is); True when it was made.
    Raises ApiError for any other refusal."""
    try:
        api.create(SECRET, spec.namespace, token_secret(spec))
    except ApiError as exc:
        if exc.status != 409:
            raise
        return False
    return True
