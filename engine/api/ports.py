"""Free TCP ports on 127.0.0.1 for servers started next, held against reuse for a while."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port for a server started next. Merely closing a bound socket would leave the port
    free for anyone: the kernel may hand it to another bind(0) or to an outgoing connection
    before the server binds it. So it is left in TIME_WAIT by a connection of our own: for
    about a minute the kernel gives it to no one else, while servers that bind with
    SO_REUSEADDR (uvicorn, ZMQ) still can."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)):
            accepted, _ = listener.accept()
            accepted.close()  # closed first, this side (our port) keeps the TIME_WAIT
    return port
