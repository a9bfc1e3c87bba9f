"""The decode node's side of the control channel: one ZMQ DEALER per prefill worker.

Sockets use ZMQ_IMMEDIATE, so a message is only queued on a live connection: a request
never waits in a buffer for a dead worker and is never delivered, stale, to its successor.
Nothing but a `Hello` goes to a worker before it paired on the current connection: it
answered with a `Welcome` that proves it holds the deployment's token, and its
`Fingerprint` is this node's. Only then does anything carrying this node's agent metadata
and KV addresses go out.

A new endpoint's first messages wait here (not in ZMQ, and never by blocking the engine
thread) until it paired; they come back from `unsent()`, never delivered, when the
connection is not up within `CONNECT_TIMEOUT_S` or no answer comes within
`WELCOME_TIMEOUT_S`. The endpoint is then down: messages for it are refused at once, while
ZMQ keeps reconnecting and the client keeps greeting in the background, so a worker that
comes back is used again as soon as it has paired. A connection that drops (a worker
killed mid-request) is reported at once (`lost()`, from the socket's monitor) rather than
found out at the request's deadline, and the endpoint is down until it pairs anew. A
worker that refuses the handshake, or fails it, is not tried again for `RETRY_AFTER_S`.
At most `MAX_SOCKETS` are kept: the least recently used one is closed when another is
needed, and reported lost.
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
import zmq
from zmq.utils.monitor import recv_monitor_message

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
from tandem.engine.transfer.messages import FromPrefill, decode_from_prefill, encode

logger = logging.getLogger(__name__)

# How long a new endpoint's first messages wait for its connection, then for its answer
# to `Hello` (the worker reads it between two steps, and a long prefill step on a CPU takes
# seconds), and how long a worker that refused or failed the handshake is left alone.
CONNECT_TIMEOUT_S = 0.5
WELCOME_TIMEOUT_S = 10.0
RETRY_AFTER_S = 5.0
# Prefill workers a decode node keeps a socket to (far more than a deployment has).
MAX_SOCKETS = 64


@dataclass
class Session:
    """The handshake on one endpoint's current connection. Messages wait in `messages`
    while `deadline` is set (a new endpoint); with none set and not `paired`, the endpoint
    is down."""

    deadline: float | None
    nonce: bytes = field(default_factory=lambda: os.urandom(16))
    greeted: bool = False  # the Hello is on the connection
    paired: bool = False
    agent: str | None = None  # the worker's NIXL agent, from its Welcome
    messages: list[msgspec.Struct] = field(default_factory=list)


class PrefillClient:
    """Owns the DEALER sockets and their monitors, registering each with the node's
    poller. It pairs only with workers whose fingerprint is `fingerprint` and that hold
    `token`, counting refusals in `metrics`; `clock` is the monotonic clock of its
    deadlines."""

    def __init__(
        self,
        context: zmq.Context,
        poller: zmq.Poller,
        fingerprint: Fingerprint,
        token: DeploymentToken,
        metrics: NodeMetrics,
        max_sockets: int = MAX_SOCKETS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.context = context
        self.poller = poller
        self.fingerprint = fingerprint
        self.token = token
        self.metrics = metrics
        self.max_sockets = max_sockets
        self.clock = clock
        self.sockets: OrderedDict[str, zmq.Socket] = OrderedDict()  # least recent first
        self.monitors: dict[str, zmq.Socket] = {}
        self.sessions: dict[str, Session] = {}
        self.refused: dict[str, float] = {}  # endpoint -> when it may be tried again
        self._unsent: list[tuple[str, msgspec.Struct]] = []
        self._evicted: list[str] = []

    def send(self, endpoint: str, message: msgspec.Struct) -> bool:
        """Queue `message` for the worker at `endpoint` ("tcp://host:port"), or keep it
        until a new endpoint has paired. False (nothing queued) when ZMQ cannot use the
        endpoint, it is down, or it refused or failed the handshake lately."""
        if self.refused.get(endpoint, 0.0) > self.clock():
            return False
        sock = self.sockets.get(endpoint) or self._open(endpoint)
        if sock is None:
            return False
        self.sockets.move_to_end(endpoint)
        session = self.sessions[endpoint]
        if not session.paired:
            if session.deadline is None:
                return False  # down
            session.messages.append(message)
            return True
        try:
            sock.send(encode(message), zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # the caller says what it gives up
            logger.debug("prefill worker %s unreachable: %s", endpoint, exc)
            return False
        return True

    def unsent(self) -> list[tuple[str, msgspec.Struct]]:
        """Greet every endpoint whose connection is up and not greeted yet; return, as
        (endpoint, message), what was given up since the last call (its endpoint did not
        pair in time, refused, or was evicted): none of it was ever sent."""
        now = self.clock()
        for endpoint, session in list(self.sessions.items()):
            if not session.greeted:
                self._greet(endpoint, session, now)
            if session.deadline is not None and now >= session.deadline:
                step = "answer to hello" if session.greeted else "connection"
                logger.warning("prefill worker %s: no %s; giving up", endpoint, step)
                self._give_up(endpoint)
        unsent, self._unsent = self._unsent, []
        return unsent

    def receive(self) -> list[tuple[str, FromPrefill]]:
        """Every reply waiting on any socket, as (endpoint, message); the answers to
        `Hello` are handled here."""
        replies = []
        for endpoint, sock in list(self.sockets.items()):
            while endpoint in self.sockets:
                try:
                    data = sock.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                try:
                    reply = decode_from_prefill(data)
                except msgspec.DecodeError as exc:
                    logger.warning("undecodable reply from %s: %s", endpoint, exc)
                    continue
                if isinstance(reply, Welcome | PairingRefused):
                    self._answered(endpoint, reply)
                else:
                    replies.append((endpoint, reply))
        return replies

    def lost(self) -> list[str]:
        """Endpoints whose connection dropped since the last call (the worker died, or the
        network did, or its socket was evicted): nothing sent there before may ever be
        answered. Each is down until it pairs again on a new connection."""
        dropped, self._evicted = self._evicted, []
        for endpoint, monitor in self.monitors.items():
            while True:
                try:
                    event = recv_monitor_message(monitor, zmq.NOBLOCK)
                except zmq.Again:
                    break
                if event["event"] == zmq.EVENT_DISCONNECTED and endpoint not in dropped:
                    dropped.append(endpoint)
        for endpoint in dropped:
            if endpoint in self.sessions:
                self._give_up(endpoint)
                self.sessions[endpoint] = Session(deadline=None)
        return dropped

    def agent_of(self, endpoint: str) -> str | None:
        """The NIXL agent of the worker at `endpoint`, as it said when it last paired."""
        session = self.sessions.get(endpoint)
        return session.agent if session is not None else None

    def _greet(self, endpoint: str, session: Session, now: float) -> None:
        """Send `Hello` if the connection is up (else nothing: ZMQ is connecting)."""
        hello = Hello(self.fingerprint, session.nonce, self.token.proof(HELLO_LABEL, session.nonce))
        try:
            self.sockets[endpoint].send(encode(hello), zmq.NOBLOCK)
        except zmq.ZMQError:
            return
        session.greeted = True
        if session.deadline is not None:
            session.deadline = now + WELCOME_TIMEOUT_S

    def _answered(self, endpoint: str, reply: Welcome | PairingRefused) -> None:
        """Pair on a `Welcome` that proves the token and matches; else refuse the worker.
        An answer to an earlier connection's `Hello` is ignored."""
        session = self.sessions.get(endpoint)
        if session is None or not session.greeted or session.paired:
            return
        if isinstance(reply, Welcome) and reply.nonce != session.nonce:
            return
        if isinstance(reply, PairingRefused):
            reason, detail = reply.reason[:20], f"it refused: {reply.detail[:200]}"
        else:
            reason, detail = self._check_welcome(session, reply)
        if reason is not None:
            logger.warning("not pairing with prefill worker %s (%s): %s", endpoint, reason, detail)
            self.metrics.child(self.metrics.pairings_refused, reason=reason).inc()
            self._refuse(endpoint)
            return
        logger.info("paired with prefill worker %s (agent %s)", endpoint, reply.agent)
        session.paired, session.deadline, session.agent = True, None, reply.agent
        waiting, session.messages = session.messages, []
        for message in waiting:
            try:
                self.sockets[endpoint].send(encode(message), zmq.NOBLOCK)
            except zmq.ZMQError:  # dropped since: `lost()` reports it
                self._unsent.append((endpoint, message))

    def _check_welcome(self, session: Session, welcome: Welcome) -> tuple[str | None, str]:
        if welcome.role != "prefill":
            return "role", f"it is a {welcome.role[:20]!r} node"
        if not self.token.verifies(WELCOME_LABEL, session.nonce, welcome.proof):
            return "token", "it does not hold the deployment token"
        field_name = self.fingerprint.mismatch(welcome.fingerprint)
        if field_name is not None:
            return field_name, self.fingerprint.describe(welcome.fingerprint, field_name)
        return None, ""

    def _refuse(self, endpoint: str) -> None:
        """The worker did not pair: what waited comes back unsent, its socket is closed,
        and it is left alone for `RETRY_AFTER_S`."""
        self._give_up(endpoint)
        self._close(endpoint)
        now = self.clock()
        self.refused = {e: t for e, t in self.refused.items() if t > now}
        self.refused[endpoint] = now + RETRY_AFTER_S

    def _give_up(self, endpoint: str) -> None:
        session = self.sessions[endpoint]
        self._unsent += [(endpoint, m) for m in session.messages]
        session.messages, session.deadline = [], None

    def _open(self, endpoint: str) -> zmq.Socket | None:
        """A new socket connecting to `endpoint` (the least recently used one closed if
        `max_sockets` are open); None when ZMQ refuses the endpoint."""
        sock = self.context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IMMEDIATE, 1)
        try:
            sock.connect(endpoint)
        except zmq.ZMQError as exc:
            logger.warning("prefill worker %r: cannot connect: %s", endpoint, exc)
            sock.close(0)
            return None
        if len(self.sockets) >= self.max_sockets:
            self._evict(next(iter(self.sockets)))
        self.monitors[endpoint] = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self.poller.register(sock, zmq.POLLIN)
        self.poller.register(self.monitors[endpoint], zmq.POLLIN)
        self.sockets[endpoint] = sock
        self.sessions[endpoint] = Session(deadline=self.clock() + CONNECT_TIMEOUT_S)
        self._greet(endpoint, self.sessions[endpoint], self.clock())
        return sock

    def _evict(self, endpoint: str) -> None:
        logger.warning("closing the socket to prefill worker %s (%d open)", endpoint,
                       len(self.sockets))  # fmt: skip
        self._give_up(endpoint)
        self._close(endpoint)
        self._evicted.append(endpoint)

    def _close(self, endpoint: str) -> None:
        sock, monitor = self.sockets.pop(endpoint), self.monitors.pop(endpoint)
        del self.sessions[endpoint]
        self.poller.unregister(sock)
        self.poller.unregister(monitor)
        sock.disable_monitor()
        monitor.close(0)
        sock.close(0)

    def close(self) -> None:
        for endpoint in list(self.sockets):
            self._close(endpoint)
