"""`free_port`: the port stays held against other binds, and a server can still take it."""

import errno
import socket

import pytest

from tandem.engine.api.ports import free_port


def test_a_free_port_is_held_from_plain_binds_and_open_to_servers():
    port = free_port()
    with socket.socket() as plain, pytest.raises(OSError) as refused:
        plain.bind(("127.0.0.1", port))  # what bind(0) and outgoing connections respect
    assert refused.value.errno == errno.EADDRINUSE
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # uvicorn, ZMQ
        server.bind(("127.0.0.1", port))
        server.listen(1)
        assert server.getsockname()[1] == port


def test_ports_handed_out_in_a_row_are_distinct():
    ports = [free_port() for _ in range(20)]
    assert len(set(ports)) == len(ports)
