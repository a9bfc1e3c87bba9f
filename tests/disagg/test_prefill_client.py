"""The decode node's ZMQ client to prefill workers, on real sockets: an endpoint it cannot
use is refused without raising, a new endpoint's first messages wait for its connection
off the engine thread (never a blocking wait), those it gives up on come back as unsent,
and the sockets it keeps are bounded (an evicted one is closed and reported lost)."""

from __future__ import annotations

import torch
import zmq

from tandem.decode_node.prefill_client import CONNECT_TIMEOUT_S, PrefillClient
from tandem.engine.kv_transfer import AbortAck, AbortPrefill, decode_to_prefill, encode
from tandem.engine.ports import free_port
from tests.disagg.nodes import wait_until

torch.set_num_threads(1)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_client(context: zmq.Context, clock: Clock, max_sockets: int = 64) -> PrefillClient:
    return PrefillClient(context, zmq.Poller(), max_sockets=max_sockets, clock=clock)


def abort(i: int = 0) -> AbortPrefill:
    return AbortPrefill(f"r{i}", 1, "decode")


def dead_endpoint() -> str:
    return f"tcp://127.0.0.1:{free_port()}"  # nothing listens there


def test_an_endpoint_zmq_cannot_use_is_refused_without_raising():
    context = zmq.Context()
    client = make_client(context, Clock())
    try:
        assert client.send("x", abort()) is False
        assert client.send("tcp://:", abort()) is False
        assert not client.sockets and not client.unsent()
    finally:
        client.close()
        context.term()


def test_a_dead_endpoint_never_blocks_and_its_messages_come_back_unsent():
    context = zmq.Context()
    clock = Clock()
    client = make_client(context, clock)
    endpoint = dead_endpoint()
    try:
        assert client.send(endpoint, abort(0)) is True  # waiting for the connection
        assert client.send(endpoint, abort(1)) is True
        assert client.unsent() == []
        clock.now += CONNECT_TIMEOUT_S
        assert client.unsent() == [(endpoint, abort(0)), (endpoint, abort(1))]
        assert client.unsent() == []
    finally:
        client.close()
        context.term()


def test_a_live_endpoint_gets_what_waited_for_its_connection():
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    client = make_client(context, Clock())
    endpoint = f"tcp://127.0.0.1:{port}"
    try:
        assert client.send(endpoint, abort(0)) and client.send(endpoint, abort(1))
        got = []

        def delivered() -> bool:
            assert client.unsent() == []  # flushes; the clock never passes the deadline
            while router.poll(0):
                got.append(router.recv_multipart())
            return len(got) == 2

        assert wait_until(delivered, interval=0.01)
        assert [decode_to_prefill(data) for _, data in got] == [abort(0), abort(1)]
        router.send_multipart([got[0][0], encode(AbortAck("r0", 1))])
        replies = []
        assert wait_until(lambda: replies.extend(client.receive()) or replies)
        assert replies == [(endpoint, AbortAck("r0", 1))]
    finally:
        client.close()
        router.close(0)
        context.term()


def test_sockets_are_bounded_and_an_evicted_one_is_closed_and_reported_lost():
    context = zmq.Context()
    client = make_client(context, Clock(), max_sockets=2)
    first, second, third = dead_endpoint(), dead_endpoint(), dead_endpoint()
    try:
        client.send(first, abort(0))
        client.send(second, abort(1))
        client.send(first, abort(2))  # first is now the most recently used
        evicted = client.sockets[second]
        client.send(third, abort(3))
        assert list(client.sockets) == [first, third] and evicted.closed
        assert client.lost() == [second]
        assert client.unsent() == [(second, abort(1))]  # never queued on a connection
    finally:
        client.close()
        context.term()
