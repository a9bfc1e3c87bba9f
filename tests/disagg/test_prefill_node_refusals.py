"""A malformed prefill request is refused on its own: the decode node hears `PrefillFailed`,
`tandem_refused_inputs_total` counts it by reason, no block stays taken, and the worker
goes on serving the next request. The wire schema types sampling parameters: a value of the
wrong type never decodes, a field the node does not know is ignored (a newer decode
node's, during a rolling upgrade). On its socket, the node takes work only from a
connection that paired (`Hello`)."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import msgspec
import pytest
import zmq

from tandem.engine.api.deployment_token import DeploymentToken
from tandem.engine.api.kv_events import NO_TIER_EVENTS, load_of
from tandem.engine.api.ports import free_port
from tandem.engine.api.wire import HELLO_LABEL, PROTOCOL_VERSION, Fingerprint, Hello, Welcome
from tandem.engine.core.sampling_params import SamplingParams
from tandem.engine.transfer.messages import (
    AgentInfo,
    PrefillFailed,
    PrefillRequest,
    decode_from_prefill,
    decode_to_prefill,
    encode,
)
from tandem.node.loop import NodeLoop
from tandem.prefill_node.server import PrefillLoop
from tests.disagg.nodes import wait_until
from tests.disagg.test_prefill_node_keys import DEAD, PROMPT, Prefill
from tests.disagg.test_prefill_node_machine import NEVER_S, first_token


def request(w: Prefill, request_id: str, sampling: dict) -> PrefillRequest:
    name, _ = DEAD
    layout = w.agent.remote_layout(name)
    return PrefillRequest(
        request_id, 1, PROMPT, SamplingParams(**sampling), 0, [0, 1],
        AgentInfo(name, b"", layout), NEVER_S, time.time(),
    )  # fmt: skip


def submit(w: Prefill, request_id: str, sampling: dict) -> None:
    w.node.submit(DEAD[1], request(w, request_id, sampling))


def with_sampling(msg: PrefillRequest, **fields: object) -> bytes:
    """`msg` on the wire with its sampling fields changed as another process could."""
    raw = msgspec.msgpack.decode(encode(msg))
    raw["sampling"].update(fields)
    return msgspec.msgpack.encode(raw)


def refused(w: Prefill, reason: str) -> float:
    m = w.node.core.metrics
    return m.child(m.refused_inputs, reason=reason)._value.get()


def assert_serves_next(w: Prefill, free_before: int) -> None:
    """A good request after the bad one is prefilled, and every block comes back."""
    submit(w, "next", {})
    w.run()
    assert [d.request_id for d in w.agent.notified] == ["next"]
    assert w.agent.notified[0].token_id == first_token(PROMPT)
    w.assert_clean()
    counts = w.node.core.kv.check_integrity()
    assert counts.free + counts.cached == free_before  # cached blocks are free to evict


@pytest.mark.parametrize("field, value", [("temperature", "hot"), ("top_p", 7.0), ("n", 0)])
def test_a_sampling_value_of_the_wrong_type_or_range_never_decodes(field, value):
    w = Prefill()
    data = with_sampling(request(w, "bad", {}), **{field: value})
    with pytest.raises(msgspec.ValidationError, match=r"\$\.sampling"):
        decode_to_prefill(data)


def test_a_peer_the_transfer_agent_rejects_is_refused_and_counted():
    w = Prefill()
    free = w.node.core.kv.check_integrity().free

    def reject(info, ranks=()):
        raise RuntimeError("NIXL_ERR_INVALID_PARAM: bad metadata")  # not a ValueError

    w.agent.connect = reject
    submit(w, "bad", {})
    ((_, failed),) = w.replies
    assert failed.reason.startswith("peer:") and "bad metadata" in failed.reason
    assert refused(w, "peer") == 1 and refused(w, "invalid") == 0
    del w.agent.connect
    assert_serves_next(w, free)


def test_an_unexpected_error_refuses_the_message_not_the_node():
    w = Prefill()
    free = w.node.core.kv.check_integrity().free

    def broken(spec):
        raise RuntimeError("the grammar compiler broke")

    w.node.core.grammars = SimpleNamespace(matcher=broken)
    submit(w, "bad", {"structured_outputs": {"json": {"type": "object"}}})
    ((_, failed),) = w.replies
    assert failed.reason == "error: the grammar compiler broke"
    assert refused(w, "error") == 1 and refused(w, "invalid") == 0
    assert_serves_next(w, free)


def test_an_unknown_sampling_field_is_ignored_by_rule():
    w = Prefill()
    msg = decode_to_prefill(with_sampling(request(w, "r", {"temperature": 0.0}), future_knob=3))
    w.node.submit(DEAD[1], msg)
    assert not w.replies
    w.run()
    assert [d.token_id for d in w.agent.notified] == [first_token(PROMPT)]
    w.assert_clean()


class Socket:
    """The real prefill loop on its ZMQ port, and a DEALER connected to it."""

    def __init__(self, w: Prefill) -> None:
        core = w.node.core
        core.agent.name = "prefill-test"
        core.load = lambda: load_of(core.scheduler)
        core.fingerprint = Fingerprint(PROTOCOL_VERSION, "m", "", "float32", 16, "1x2x1x8")
        core.copies_in_flight = False  # no KV tiers
        core.tier_events = lambda: NO_TIER_EVENTS
        self.core = core
        self.node = PrefillLoop(core, NodeLoop(), "127.0.0.1", free_port(), 0)
        self.context = zmq.Context()
        self.dealer = self.context.socket(zmq.DEALER)
        self.dealer.setsockopt(zmq.LINGER, 0)
        self.dealer.connect(f"tcp://127.0.0.1:{self.node.zmq_port}")

    def greet(self) -> None:
        """Pair as a decode node of the same deployment (no token: authentication off)."""
        nonce = os.urandom(16)
        hello = Hello(self.core.fingerprint, nonce, DeploymentToken().proof(HELLO_LABEL, nonce))
        self.dealer.send(encode(hello))
        assert wait_until(lambda: self.node.run_once() or self.dealer.poll(0), interval=0)
        assert isinstance(decode_from_prefill(self.dealer.recv()), Welcome)

    def serve_until(self, done) -> bool:
        def turn() -> bool:
            self.node.run_once()
            for transfer, _ in self.core.agent.in_flight():
                transfer.state = "DONE"
            return done()

        return wait_until(turn, interval=0)

    def close(self) -> None:
        self.dealer.close(0)
        self.context.term()
        self.node.socket.close(0)
        self.node.publisher.close()
        self.node.context.term()


def test_the_node_counts_a_message_it_cannot_decode_and_serves_the_next():
    """The real loop on its ZMQ socket: garbage and a message of two frames, then a good
    request from the same peer."""
    w = Prefill()
    sock = Socket(w)
    try:
        sock.greet()
        sock.dealer.send(b"\xc1 not msgpack")
        sock.dealer.send_multipart([b"two", b"frames"])  # was dropped without a count
        sock.dealer.send(encode(request(w, "next", {})))
        assert sock.serve_until(lambda: bool(sock.core.agent.notified))
        assert refused(w, "undecodable") == 2
        assert [d.request_id for d in sock.core.agent.notified] == ["next"]
    finally:
        sock.close()


def test_a_connection_that_never_paired_gets_no_work_done():
    w = Prefill()
    sock = Socket(w)
    try:
        sock.dealer.send(encode(request(w, "stranger", {})))
        assert sock.serve_until(lambda: sock.dealer.poll(0))
        failed = decode_from_prefill(sock.dealer.recv())
        assert failed == PrefillFailed("stranger", 1, "unpaired")
        assert refused(w, "unpaired") == 1 and not w.node.jobs
        sock.greet()  # the same connection, paired now, is served
        sock.dealer.send(encode(request(w, "next", {})))
        assert sock.serve_until(lambda: bool(sock.core.agent.notified))
    finally:
        sock.close()
