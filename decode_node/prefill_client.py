"""The decode node's side of the control channel: one ZMQ DEALER per prefill worker.

Sockets use ZMQ_IMMEDIATE, so a message is only queued on a live connection: a request
never waits in a buffer for a dead worker and is never delivered, stale, to its successor.
Each socket has a monitor, so a connection that drops (a worker killed mid-request) is
reported at once (`lost()`) rather than found out at the request's deadline.
"""

from __future__ import annotations

import logging
import re

import msgspec
import zmq
from zmq.utils.monitor import recv_monitor_message

from tandem.engine.kv_transfer import FromPrefill, decode_from_prefill, encode

logger = logging.getLogger(__name__)

# How long the first send to a new worker waits for the connection.
CONNECT_TIMEOUT_MS = 500
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


class PrefillClient:
    """Owns the DEALER sockets and their monitors, registering each with the node's
    poller."""

    def __init__(self, context: zmq.Context, poller: zmq.Poller) -> None:
        self.context = context
        self.poller = poller
        self.sockets: dict[str, zmq.Socket] = {}
        self.monitors: dict[str, zmq.Socket] = {}

    def send(self, endpoint: str, message: msgspec.Struct) -> bool:
        """Queue `message` for the worker at `endpoint` ("tcp://host:port"). False when no
        connection to it is up."""
        new = endpoint not in self.sockets
        sock = self._socket(endpoint)
        if new:
            sock.poll(CONNECT_TIMEOUT_MS, zmq.POLLOUT)
        try:
            sock.send(encode(message), zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # the caller says what it gives up
            logger.debug("prefill worker %s unreachable: %s", endpoint, exc)
            return False
        return True

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
        network did): nothing sent there before may ever be answered."""
        dropped = []
        for endpoint, monitor in self.monitors.items():
            while True:
                try:
                    event = recv_monitor_message(monitor, zmq.NOBLOCK)
                except zmq.Again:
                    break
                if event["event"] == zmq.EVENT_DISCONNECTED and endpoint not in dropped:
                    dropped.append(endpoint)
        return dropped

    def _socket(self, endpoint: str) -> zmq.Socket:
        sock = self.sockets.get(endpoint)
        if sock is None:
            sock = self.context.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.IMMEDIATE, 1)
            monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            sock.connect(endpoint)
            self.poller.register(sock, zmq.POLLIN)
            self.poller.register(monitor, zmq.POLLIN)
            self.sockets[endpoint] = sock
            self.monitors[endpoint] = monitor
        return sock

    def close(self) -> None:
        for endpoint, sock in self.sockets.items():
            sock.disable_monitor()
            self.monitors[endpoint].close(0)
            sock.close(0)
