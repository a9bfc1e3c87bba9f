"""The deployment's shared secret: what the router, the decode nodes and the prefill nodes
of one deployment hold and nobody else does (the operator keeps it in a Secret; `tandem
serve` makes one). Control ports answer only its holders: HTTP requests bear it
(`Authorization: Bearer`), and on the ZMQ control channel each side proves it holds it over
a nonce (`proof`), so it never travels there. Every comparison is constant-time."""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets

logger = logging.getLogger(__name__)

ENV = "TANDEM_AUTH_TOKEN"
HEADER = "authorization"
_MIN_LEN = 16


class DeploymentToken:
    """`value` empty means authentication is off (a node started by hand, or by a test):
    every check passes, and proofs are made with an empty key, so such nodes still pair only
    with each other, never with a deployment that has a token."""

    def __init__(self, value: str = "") -> None:
        if value and len(value) < _MIN_LEN:
            raise ValueError(f"a deployment token has at least {_MIN_LEN} characters")
        self.value = value
        self._key = value.encode()

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> DeploymentToken:
        """The token in `$TANDEM_AUTH_TOKEN` (off, with a warning, where unset)."""
        value = (os.environ if environ is None else environ).get(ENV, "").strip()
        if not value:
            logger.warning("%s is not set: control ports are not authenticated", ENV)
        return cls(value)

    @classmethod
    def generate(cls) -> DeploymentToken:
        return cls(secrets.token_urlsafe(32))

    def headers(self) -> dict[str, str]:
        """The HTTP headers a holder sends to a control port."""
        return {HEADER: f"Bearer {self.value}"} if self.value else {}

    def admits(self, header: str | None) -> bool:
        """Whether an `Authorization` header bears this token (always, when off)."""
        if not self.value:
            return True
        given = header[7:] if header and header[:7].lower() == "bearer " else ""
        return hmac.compare_digest(given.encode(), self._key)

    def proof(self, label: str, nonce: bytes) -> bytes:
        """HMAC-SHA256 of `label` and `nonce` under the token: a side's answer to a nonce."""
        return hmac.new(self._key, label.encode() + b"\0" + nonce, hashlib.sha256).digest()

    def verifies(self, label: str, nonce: bytes, proof: bytes) -> bool:
        return hmac.compare_digest(self.proof(label, nonce), proof)
