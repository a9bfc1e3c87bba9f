"""The prefill node's side of the handshake: which decode-node connections may send it work.

A decode node's first message on a connection is a `Hello`. The prefill node pairs with it
when the `Hello` proves it holds the deployment's token and its `Fingerprint` equals this
node's; it answers `Welcome` (with its own proof), or `PairingRefused` with the reason,
logged and counted in `tandem_pairings_refused_total{reason}`. Requests and aborts from a
connection that never paired are refused (`unpaired`). ZMQ names each connection with a
fresh identity, so a reconnecting (or restarted) decode node greets again, and one peer
cannot send under another's identity.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from tandem.engine.api.deployment_token import DeploymentToken
from tandem.engine.api.wire import (
    HELLO_LABEL,
    WELCOME_LABEL,
    Fingerprint,
    Hello,
    PairingRefused,
    Welcome,
)
from tandem.engine.telemetry.metrics import NodeMetrics

logger = logging.getLogger(__name__)

# Connections remembered (least recently paired forgotten first): far more decode ranks
# than a deployment has; a forgotten one is refused and its decode node greets again.
MAX_PAIRED = 4096


class Pairings:
    """Owned by the prefill loop (engine thread)."""

    def __init__(
        self,
        fingerprint: Fingerprint,
        token: DeploymentToken,
        metrics: NodeMetrics,
        agent: str,
        capacity: int = MAX_PAIRED,
    ) -> None:
        self.fingerprint = fingerprint
        self.agent = agent
        self.token = token
        self.metrics = metrics
        self.capacity = capacity
        self._paired: OrderedDict[bytes, None] = OrderedDict()

    def greet(self, peer: bytes, hello: Hello) -> Welcome | PairingRefused:
        """Pair with the connection `peer` if `hello` proves the token and matches."""
        if not self.token.verifies(HELLO_LABEL, hello.nonce, hello.proof):
            return self._refuse(peer, "token", "the deployment token does not match")
        field = self.fingerprint.mismatch(hello.fingerprint)
        if field is not None:
            return self._refuse(peer, field, self.fingerprint.describe(hello.fingerprint, field))
        self._paired[peer] = None
        self._paired.move_to_end(peer)
        if len(self._paired) > self.capacity:
            self._paired.popitem(last=False)
        proof = self.token.proof(WELCOME_LABEL, hello.nonce)
        return Welcome(self.fingerprint, hello.nonce, proof, self.agent)

    def admits(self, peer: bytes) -> bool:
        return peer in self._paired

    def _refuse(self, peer: bytes, reason: str, detail: str) -> PairingRefused:
        self._paired.pop(peer, None)
        logger.warning("refusing to pair with decode connection %r: %s", peer, detail)
        m = self.metrics
        m.child(m.pairings_refused, reason=reason).inc()
        return PairingRefused(reason, detail)
