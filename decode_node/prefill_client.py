"""The decode node's side of the control channel: one ZMQ DEALER per prefill worker.

Sockets use ZMQ_IMMEDIATE, so a message is only queued on a live connection: a request
never waits in a buffer for a dead worker and is never delivered, stale, to its successor.
A new endpoint's first messages wait here (not in ZMQ, and never by blocking the engine
thread) until its connection is up; after `CONNECT_TIMEOUT_S` they come back from
`unsent()`, never delivered. Each socket has a monitor, so a connection that drops (a
worker killed mid-request) is reported at once (`lost()`) rather than found out at the
request's deadline. At most `MAX_SOCKETS` are kept: the least recently used one is closed
when another is needed, and reported lost.
"""

from __future__ import annotations

import logging
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
import zmq
from zmq.utils.monitor import recv_monitor_message

from tandem.engine.kv_transfer import FromPrefill, decode_from_prefill, encode

logger = logging.getLogger(__name__)

# How long a new endpoint's first messages wait for its connection.
CONNECT_TIMEOUT_S = 0.5
# Prefill workers a decode node keeps a socket to (far more than a deployment has).
MAX_SOCKETS = 64
# A prefill worker's endpoint, as routers name it: tcp://host:port (an IPv6 host in
# brackets). Anything else is refused before it reaches a socket.
_ENDPOINT = re.compile(r"tcp://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):([0-9]{1,5})")
_MAX_ENDPOINT_LEN = 300


def check_endpoint(endpoint: str) -> str:
    """`endpoint` if it is `tcp://host:port` with a port in 1..65535; ValueError if not."""
    match = _ENDPOINT.fullmatch(endpoint) if len(endpoint) <= _MAX_ENDPOINT_LEN else None
    if match is None or not 0 < int(match.group(2)) < 65536:
        raise ValueError("a prefill endpoint must be tcp://host:port")
    return endpoint


@dataclass
class Pending:
    """Messages waiting for a new endpoint's first connection, until `deadline`."""

    deadline: float
    messages: list[msgspec.Struct] = field(default_factory=list)


class PrefillClient:
    """Owns the DEALER sockets and their monitors, registering each with the node's
    poller; `clock` is the monotonic clock the connection deadlines use."""

    def __init__(
        self,
        context: zmq.Context,
        poller: zmq.Poller,
        max_sockets: int = MAX_SOCKETS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.context = context
        self.poller = poller
        self.max_sockets = max_sockets
        self.clock = clock
        self.sockets: OrderedDict[str, zmq.Socket] = OrderedDict()  # least recent first
        self.monitors: dict[str, zmq.Socket] = {}
        self.pending: dict[str, Pending] = {}
        self._unsent: list[tuple[str, msgspec.Struct]] = []
        self._evicted: list[str] = []

    def send(self, endpoint: str, message: msgspec.Struct) -> bool:
        """Queue `message` for the worker at `endpoint` ("tcp://host:port"), or keep it
        until a new endpoint's connection is up. False (nothing queued) when ZMQ cannot
        use the endpoint or its connection, up before, is down."""
        sock = self.sockets.get(endpoint) or self._open(endpoint)
        if sock is None:
            return False
        self.sockets.move_to_end(endpoint)
        if endpoint in self.pending:
            self.pending[endpoint].messages.append(message)
            return True
        try:
            sock.send(encode(message), zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # the caller says what it gives up
            logger.debug("prefill worker %s unreachable: %s", endpoint, exc)
            return False
        return True

    def unsent(self) -> list[tuple[str, msgspec.Struct]]:
        """Send what waits for a connection that is up now; return, as (endpoint,
        message), what was given up since the last call (its connection never came up in
        time, or its socket was evicted): none of it was ever queued on a connection."""
        now = self.clock()
        for endpoint, pending in list(self.pending.items()):
            self._flush(self.sockets[endpoint], pending)
            if not pending.messages:
                del self.pending[endpoint]
            elif now >= pending.deadline:
                logger.warning("prefill worker %s: no connection; giving up", endpoint)
                self._give_up(endpoint)
        unsent, self._unsent = self._unsent, []
        return unsent

    def receive(self) -> list[tuple[str, FromPrefill]]:
        """Every reply waiting on any socket, as (endpoint, message)."""
        replies = []
        for endpoint, sock in self.sockets.items():
            while True:
                try:
                    data = sock.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                try:
                    replies.append((endpoint, decode_from_prefill(data)))
                except msgspec.DecodeError as exc:
                    logger.warning("undecodable reply from %s: %s", endpoint, exc)
        return replies

    def lost(self) -> list[str]:
        """Endpoints whose connection dropped since the last call (the worker died, or the
        network did, or its socket was evicted): nothing sent there before may ever be
        answered."""
        dropped, self._evicted = self._evicted, []
        for endpoint, monitor in self.monitors.items():
            while True:
                try:
                    event = recv_monitor_message(monitor, zmq.NOBLOCK)
                except zmq.Again:
                    break
                if event["event"] == zmq.EVENT_DISCONNECTED and endpoint not in dropped:
                    dropped.append(endpoint)
        return dropped

    def _flush(self, sock: zmq.Socket, pending: Pending) -> None:
        while pending.messages:
            try:
                sock.send(encode(pending.messages[0]), zmq.NOBLOCK)
            except zmq.ZMQError:
                return  # not connected yet
            pending.messages.pop(0)

    def _give_up(self, endpoint: str) -> None:
        pending = self.pending.pop(endpoint, None)
        if pending is not None:
            self._unsent += [(endpoint, m) for m in pending.messages]

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
        self.pending[endpoint] = Pending(self.clock() + CONNECT_TIMEOUT_S)
        return sock

    def _evict(self, endpoint: str) -> None:
        logger.warning("closing the socket to prefill worker %s (%d open)", endpoint,
                       len(self.sockets))  # fmt: skip
        self._give_up(endpoint)
        self._close(endpoint)
        self._evicted.append(endpoint)

    def _close(self, endpoint: str) -> None:
        sock, monitor = self.sockets.pop(endpoint), self.monitors.pop(endpoint)
        self.poller.unregister(sock)
        self.poller.unregister(monitor)
        sock.disable_monitor()
        monitor.close(0)
        sock.close(0)

    def close(self) -> None:
        for endpoint in list(self.sockets):
            self._close(endpoint)
