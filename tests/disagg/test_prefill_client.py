"""The decode node's ZMQ client to prefill workers, on real sockets: an endpoint it cannot
use is refused without raising, a new endpoint's first messages wait for its connection
and its handshake off the engine thread (never a blocking wait), those it gives up on come
back as unsent, a worker that fails the handshake (another fingerprint, no token) never
receives anything but the `Hello`, and the sockets it keeps are bounded (an evicted one is
closed and reported lost)."""

from __future__ import annotations

import msgspec
import pytest
import torch
import zmq
from prometheus_client import CollectorRegistry

from tandem.decode_node.prefill_client import (
    CONNECT_TIMEOUT_S,
    RETRY_AFTER_S,
    WELCOME_TIMEOUT_S,
    PrefillClient,
)
from tandem.engine.api.deployment_token import DeploymentToken
from tandem.engine.api.ports import free_port
from tandem.engine.api.wire import Fingerprint, Hello, Welcome
from tandem.engine.telemetry.metrics import NodeMetrics
from tandem.engine.transfer.messages import AbortAck, AbortPrefill, decode_to_prefill, encode
from tandem.prefill_node.pairings import Pairings
from tests.disagg.nodes import wait_until

torch.set_num_threads(1)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


FINGERPRINT = Fingerprint(2, "m", "r1", "float32", 16, "2x2x4x16")
TOKEN = DeploymentToken("a-deployment-token-of-ours")


def metrics(role: str = "decode") -> NodeMetrics:
    return NodeMetrics(CollectorRegistry(), "m", role, "p")


def refusals(m: NodeMetrics, reason: str) -> float:
    return m.registry.get_sample_value(
        "tandem_pairings_refused_total", {"model": "m", "role": m._labels["role"], "pod": "p",
                                          "reason": reason},
    )  # fmt: skip


def make_client(
    context: zmq.Context, clock: Clock, max_sockets: int = 64, m: NodeMetrics | None = None
) -> PrefillClient:
    return PrefillClient(
        context, zmq.Poller(), FINGERPRINT, TOKEN, m or metrics(), max_sockets, clock
    )


class Worker:
    """A ROUTER socket answering `Hello` as a prefill node does (`Pairings`)."""

    def __init__(self, context: zmq.Context, pairings: Pairings, endpoint: str = "") -> None:
        self.socket = context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        if endpoint:
            self.socket.bind(endpoint)
        else:
            port = self.socket.bind_to_random_port("tcp://127.0.0.1")
            endpoint = f"tcp://127.0.0.1:{port}"
        self.endpoint = endpoint
        self.pairings = pairings
        self.got: list[tuple[bytes, msgspec.Struct]] = []

    def serve(self) -> None:
        """Read what arrived; answer each `Hello`."""
        while self.socket.poll(0):
            peer, data = self.socket.recv_multipart()
            msg = decode_to_prefill(data)
            self.got.append((peer, msg))
            if isinstance(msg, Hello):
                self.socket.send_multipart([peer, encode(self.pairings.greet(peer, msg))])

    def close(self) -> None:
        self.socket.close(0)


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


def test_a_down_endpoint_is_refused_at_once_then_used_once_its_worker_pairs():
    context = zmq.Context()
    clock = Clock()
    client = make_client(context, clock)
    endpoint = dead_endpoint()
    worker = None
    try:
        client.send(endpoint, abort(0))
        clock.now += CONNECT_TIMEOUT_S
        assert client.unsent() == [(endpoint, abort(0))]
        assert client.send(endpoint, abort(1)) is False  # down: no second wait
        worker = Worker(context, Pairings(FINGERPRINT, TOKEN, metrics("prefill"), "prefill-agent"),
                        endpoint)  # fmt: skip

        def paired() -> bool:
            assert client.unsent() == []  # greets once ZMQ has reconnected
            worker.serve()
            client.receive()
            return client.sessions[endpoint].paired

        assert wait_until(paired, interval=0.01)
        assert client.send(endpoint, abort(2)) is True
        assert wait_until(lambda: worker.serve() or len(worker.got) == 2, interval=0.01)
        assert [msg for _, msg in worker.got][1:] == [abort(2)]
    finally:
        client.close()
        if worker is not None:
            worker.close()
        context.term()


def test_a_restarted_worker_is_down_until_it_pairs_on_the_new_connection():
    context = zmq.Context()
    pairings = Pairings(FINGERPRINT, TOKEN, metrics("prefill"), "prefill-agent")
    worker = Worker(context, pairings)
    client = make_client(context, Clock())
    endpoint = worker.endpoint

    def paired() -> bool:
        client.unsent()
        worker.serve()
        client.receive()
        return client.sessions[endpoint].paired

    try:
        client.send(endpoint, abort(0))
        assert wait_until(paired, interval=0.01)
        worker.close()  # the worker dies...
        assert wait_until(lambda: client.lost() == [endpoint], interval=0.01)
        assert client.send(endpoint, abort(1)) is False  # down
        worker = Worker(context, pairings, endpoint)  # ...and comes back, a new process
        assert wait_until(paired, interval=0.01)
        assert client.send(endpoint, abort(2)) is True
        assert wait_until(lambda: worker.serve() or len(worker.got) == 2, interval=0.01)
        assert [type(m) for _, m in worker.got] == [Hello, AbortPrefill]
    finally:
        client.close()
        worker.close()
        context.term()


def test_a_worker_gets_what_waited_only_after_it_paired():
    context = zmq.Context()
    worker = Worker(context, Pairings(FINGERPRINT, TOKEN, metrics("prefill"), "prefill-agent"))
    client = make_client(context, Clock())
    endpoint = worker.endpoint
    try:
        assert client.send(endpoint, abort(0)) and client.send(endpoint, abort(1))

        def delivered() -> bool:
            assert client.unsent() == []  # greets; the clock never passes the deadline
            worker.serve()
            assert client.receive() == []  # the Welcome is the client's own business
            return len(worker.got) == 3

        assert wait_until(delivered, interval=0.01)
        messages = [msg for _, msg in worker.got]
        assert isinstance(messages[0], Hello) and messages[1:] == [abort(0), abort(1)]
        assert client.sessions[endpoint].paired
        assert client.agent_of(endpoint) == "prefill-agent"  # its notifications' sender
        worker.socket.send_multipart([worker.got[0][0], encode(AbortAck("r0", 1))])
        replies = []
        assert wait_until(lambda: replies.extend(client.receive()) or replies)
        assert replies == [(endpoint, AbortAck("r0", 1))]
    finally:
        client.close()
        worker.close()
        context.term()


OTHER_BLOCKS = msgspec.structs.replace(FINGERPRINT, block_size=32)
OTHER_REVISION = msgspec.structs.replace(FINGERPRINT, revision="r2")


@pytest.mark.parametrize(
    "fingerprint, token, reason",
    [
        (OTHER_BLOCKS, TOKEN, "block_size"),
        (OTHER_REVISION, TOKEN, "revision"),
        (FINGERPRINT, DeploymentToken("another-deployment-token"), "token"),
        (FINGERPRINT, DeploymentToken(), "token"),
    ],
)
def test_a_worker_that_will_not_pair_gets_nothing_but_the_hello(fingerprint, token, reason):
    context = zmq.Context()
    worker_metrics, decode_metrics = metrics("prefill"), metrics()
    worker = Worker(context, Pairings(fingerprint, token, worker_metrics, "prefill-agent"))
    clock = Clock()
    client = make_client(context, clock, m=decode_metrics)
    try:
        client.send(worker.endpoint, abort(0))
        assert given_back(client, worker) == [(worker.endpoint, abort(0))]
        assert [type(msg) for _, msg in worker.got] == [Hello]
        assert refusals(worker_metrics, reason) == 1 and refusals(decode_metrics, reason) == 1
        assert client.send(worker.endpoint, abort(1)) is False  # left alone for a while
        clock.now += RETRY_AFTER_S
        assert client.send(worker.endpoint, abort(2)) is True  # greets again
    finally:
        client.close()
        worker.close()
        context.term()


def given_back(client: PrefillClient, worker: Worker) -> list[tuple[str, msgspec.Struct]]:
    """Turn the handshake between them until the client gives its messages back unsent."""
    unsent = []

    def refused() -> bool:
        unsent.extend(client.unsent())
        worker.serve()
        client.receive()
        return bool(unsent)

    assert wait_until(refused, interval=0.01)
    return unsent


class Impostor(Worker):
    """Answers every `Hello` with a `Welcome` of the right fingerprint, but no token."""

    def serve(self) -> None:
        while self.socket.poll(0):
            peer, data = self.socket.recv_multipart()
            hello = decode_to_prefill(data)
            self.got.append((peer, hello))
            welcome = Welcome(FINGERPRINT, hello.nonce, b"\0" * 32, "impostor")
            self.socket.send_multipart([peer, encode(welcome)])


def test_a_listener_without_the_token_never_gets_the_decode_node_s_messages():
    context = zmq.Context()
    impostor = Impostor(context, Pairings(FINGERPRINT, TOKEN, metrics("prefill"), "prefill-agent"))
    decode_metrics = metrics()
    client = make_client(context, Clock(), m=decode_metrics)
    try:
        client.send(impostor.endpoint, abort(0))
        assert given_back(client, impostor) == [(impostor.endpoint, abort(0))]
        assert [type(msg) for _, msg in impostor.got] == [Hello]
        assert refusals(decode_metrics, "token") == 1
    finally:
        client.close()
        impostor.close()
        context.term()


def test_no_answer_to_the_hello_gives_the_messages_back_unsent():
    context = zmq.Context()
    silent = context.socket(zmq.ROUTER)
    silent.setsockopt(zmq.LINGER, 0)
    endpoint = f"tcp://127.0.0.1:{silent.bind_to_random_port('tcp://127.0.0.1')}"
    clock = Clock()
    client = make_client(context, clock)
    try:
        client.send(endpoint, abort(0))
        assert wait_until(lambda: client.unsent() == [] and client.sessions[endpoint].greeted)
        clock.now += WELCOME_TIMEOUT_S
        assert client.unsent() == [(endpoint, abort(0))]
    finally:
        client.close()
        silent.close(0)
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
