"""A malformed prefill request is refused on its own: the decode node hears `PrefillFailed`,
`tandem_refused_inputs_total` counts it by reason, no block stays taken, and the worker
goes on serving the next request. A sampling field the node does not know is ignored (a
newer decode node's, during a rolling upgrade), logged and counted."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import zmq

from tandem.engine.kv_events import load_of
from tandem.engine.kv_transfer import AgentInfo, PrefillFailed, PrefillRequest, encode
from tandem.engine.node_loop import NodeLoop
from tandem.engine.ports import free_port
from tandem.prefill_node.server import PrefillLoop
from tests.disagg.nodes import wait_until
from tests.disagg.test_prefill_worker_keys import DEAD, PROMPT, Worker
from tests.disagg.test_prefill_worker_machine import NEVER_S, first_token


def submit(w: Worker, request_id: str, sampling: dict) -> None:
    name, peer = DEAD
    layout = w.agent.remote_layout(name)
    msg = PrefillRequest(
        request_id, 1, PROMPT, sampling, 0, [0, 1], AgentInfo(name, b"", layout), NEVER_S,
        time.time(),
    )  # fmt: skip
    w.worker.submit(peer, msg)


def refused(w: Worker, reason: str) -> float:
    m = w.worker.core.metrics
    return m.child(m.refused_inputs, reason=reason)._value.get()


def assert_serves_next(w: Worker, free_before: int) -> None:
    """A good request after the bad one is prefilled, and every block comes back."""
    submit(w, "next", {})
    w.run()
    assert [d.request_id for d in w.agent.notified] == ["next"]
    assert w.agent.notified[0].token_id == first_token(PROMPT)
    w.assert_clean()
    counts = w.worker.core.kv.check_integrity()
    assert counts.free + counts.cached == free_before  # cached blocks are free to evict


def test_a_sampling_value_of_the_wrong_type_is_refused_and_counted():
    w = Worker()
    free = w.worker.core.kv.check_integrity().free
    submit(w, "bad", {"temperature": "hot"})  # a TypeError inside SamplingParams
    ((peer, failed),) = w.replies
    assert peer == DEAD[1] and isinstance(failed, PrefillFailed)
    assert failed.request_id == "bad" and failed.reason.startswith("invalid:")
    assert not w.worker.jobs and refused(w, "invalid") == 1
    assert_serves_next(w, free)


def test_a_peer_the_transfer_agent_rejects_is_refused_and_counted():
    w = Worker()
    free = w.worker.core.kv.check_integrity().free

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
    w = Worker()
    free = w.worker.core.kv.check_integrity().free

    def broken(spec):
        raise RuntimeError("the grammar compiler broke")

    w.worker.core.grammars = SimpleNamespace(matcher=broken)
    submit(w, "bad", {"structured_outputs": {"json": {"type": "object"}}})
    ((_, failed),) = w.replies
    assert failed.reason == "error: the grammar compiler broke"
    assert refused(w, "error") == 1 and refused(w, "invalid") == 0
    assert_serves_next(w, free)


def test_an_unknown_sampling_field_is_ignored_logged_and_counted(caplog):
    w = Worker()
    with caplog.at_level(logging.WARNING, "tandem.prefill_node.worker"):
        submit(w, "r", {"temperature": 0.0, "future_knob": 3})
    assert not w.replies and refused(w, "unknown_sampling_field") == 1
    assert "future_knob" in caplog.text
    w.run()
    assert [d.token_id for d in w.agent.notified] == [first_token(PROMPT)]
    w.assert_clean()


def test_the_node_counts_a_message_it_cannot_decode_and_serves_the_next():
    """The real loop on its ZMQ socket: garbage and a message of two frames, then a good
    request from the same peer."""
    w = Worker()
    core = w.worker.core
    core.agent.name = "prefill-test"
    core.load = lambda: load_of(core.scheduler)
    node = PrefillLoop(core, NodeLoop(), "127.0.0.1", free_port(), 0)
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    try:
        dealer.connect(f"tcp://127.0.0.1:{node.zmq_port}")
        dealer.send(b"\xc1 not msgpack")
        dealer.send_multipart([b"two", b"frames"])  # was dropped without a count
        name, _ = DEAD
        good = PrefillRequest(
            "next", 1, PROMPT, {}, 0, [0, 1], AgentInfo(name, b"", core.agent.remote_layout(name)),
            NEVER_S, time.time(),
        )  # fmt: skip
        dealer.send(encode(good))

        def served() -> bool:
            node.run_once()
            for transfer, _ in core.agent.in_flight():
                transfer.state = "DONE"
            return bool(core.agent.notified)

        assert wait_until(served, interval=0)
        assert refused(w, "undecodable") == 2
        assert [d.request_id for d in core.agent.notified] == ["next"]
    finally:
        dealer.close(0)
        context.term()
        node.socket.close(0)
        node.publisher.close()
        node.context.term()
