"""What the decode worker refuses at its boundaries, on the test-only runner and prefill
workers of the state machine: a notification that does not decode, a first token outside
the vocabulary, a request id that is still live (its stream, or the hold of an abandoned
attempt whose writes may still land). Each is refused on its own, counted in
`tandem_refused_inputs_total`, and leaves every block accounted for. (Sampling fields are
typed by the wire schema: tests/disagg/test_decode_http_boundary.py.)"""

from __future__ import annotations

import pytest

from tandem.decode_node.node import DuplicateRequest, GenerateInput
from tandem.engine.core.sampling_params import SamplingParams
from tandem.engine.transfer.messages import (
    AbortAck,
    AbortPrefill,
    PrefillDone,
    PrefillFailed,
    PrefillRequest,
    encode,
)
from tests.disagg.test_decode_node_machine import WORKERS, DecodeNodeMachine
from tests.engine.test_scheduler import VOCAB
from tests.engine.test_scheduler_machine import tokens_alone


def refused(machine: DecodeNodeMachine, reason: str) -> float:
    m = machine.node.core.metrics
    return m.child(m.refused_inputs, reason=reason)._value.get()


def sent_remote(machine: DecodeNodeMachine) -> str:
    """One request sent to a prefill worker; its hold key."""
    machine.add(prefix=0, tail=0, max_tokens=3, remote=True)
    machine.step()
    (key,) = machine.may_write
    return key


def test_a_notification_that_does_not_decode_is_counted_and_dropped():
    machine = DecodeNodeMachine()
    key = sent_remote(machine)
    machine.node.on_notification("prefill", b"\xc1 not msgpack")
    machine.node.on_notification("prefill", encode(AbortAck("r0", 1)))  # not a PrefillDone
    assert refused(machine, "undecodable") == 2
    assert "r0" in machine.node.core.scheduler.remote  # still waiting for its prefill
    machine.deliver_done(key)
    machine.teardown()
    assert machine.records["r0"][-1]["finish_reason"] == "length"


@pytest.mark.parametrize("token_id", [VOCAB, 10**6, -1])
def test_a_first_token_outside_the_vocabulary_never_reaches_the_model(token_id):
    """The attempt fails over (prefilled here, per the policy) and its blocks come back."""
    machine = DecodeNodeMachine()
    key = sent_remote(machine)
    msg = machine.may_write.pop(key)
    bad = PrefillDone(msg.request_id, msg.attempt, token_id, None, 1, 1024, 0.0, 0.0)
    machine.node.on_notification(machine.client.agent_of(machine.writers[key]), encode(bad))
    assert refused(machine, "first_token") == 1
    m = machine.node.core.metrics
    assert m.child(m.prefill_fallbacks, reason="error")._value.get() == 1
    assert not machine.node.core.kv.hold_keys()  # every write had landed: nothing held
    machine.teardown()
    records = machine.records["r0"]
    assert records[-1]["finish_reason"] == "length"
    assert [t for r in records for t in r["token_ids"]] == machine.expected["r0"]


def test_a_live_request_id_is_refused_and_the_first_goes_on():
    machine = DecodeNodeMachine()
    key = sent_remote(machine)
    again = GenerateInput("r0", [1, 2, 3], SamplingParams(max_tokens=1))
    with pytest.raises(DuplicateRequest, match="'r0' is already in use"):
        machine.node.add(again, lambda record: None)
    assert refused(machine, "duplicate_id") == 1
    machine.deliver_done(key)
    machine.teardown()
    assert machine.records["r0"][-1]["finish_reason"] == "length"


def test_an_id_whose_abandoned_attempt_may_still_be_written_is_refused():
    """The client left while r0's prefill was in flight: its blocks stay held until the
    worker confirms. A new r0 would take the same hold key (a collision on the engine
    thread) or have its own attempt's answer release the old blocks under the writes."""
    machine = DecodeNodeMachine()
    key = sent_remote(machine)
    assert machine.node.abort("r0")
    machine.step()  # the abort goes out; the hold waits for the answer
    kv = machine.node.core.kv
    assert kv.is_held(key)
    with pytest.raises(DuplicateRequest, match="still being written"):
        machine.node.add(GenerateInput("r0", [1, 2, 3], SamplingParams(max_tokens=1)), print)
    assert kv.is_held(key) and "r0" not in machine.node.streams
    machine.node.on_reply(WORKERS[0], AbortAck("r0", 1))
    machine.may_write.pop(key)
    assert not kv.hold_keys()
    fresh = GenerateInput("r0", [1, 2, 3], SamplingParams(max_tokens=1, ignore_eos=True))
    machine.records["r0"], machine.expected["r0"] = [], tokens_alone([1, 2, 3], 1)
    machine.node.add(fresh, machine.records["r0"].append)  # free to reuse now
    machine.teardown()
    assert machine.records["r0"][-1]["finish_reason"] == "length"


def test_a_request_the_client_gave_up_sending_fails_over_and_holds_nothing():
    """The worker's connection never came up: nothing of the attempt was queued, so none
    of it can land; the request moves on at once and its blocks come back."""
    machine = DecodeNodeMachine()
    key = sent_remote(machine)
    ((endpoint, msg),) = [(e, m) for e, m in machine.client.sent if isinstance(m, PrefillRequest)]
    machine.may_write.pop(key)
    machine.node.on_unsent(endpoint, msg)
    m = machine.node.core.metrics
    assert m.child(m.prefill_fallbacks, reason="unreachable")._value.get() == 1
    assert not machine.node.core.kv.hold_keys()
    machine.node.on_unsent(endpoint, AbortPrefill("r0", 1, "decode"))  # resent as usual
    machine.teardown()
    assert machine.records["r0"][-1]["finish_reason"] == "length"


def test_an_answer_from_anyone_but_the_attempt_s_worker_changes_nothing():
    """Another paired worker's reply, or another NIXL agent's notification, about an
    attempt: dropped and counted; the attempt's own worker completes it after."""
    machine = DecodeNodeMachine()
    key = sent_remote(machine)
    msg = machine.may_write[key]
    other = next(w for w in WORKERS if w != machine.writers[key])
    machine.node.on_reply(other, PrefillFailed(msg.request_id, msg.attempt, "forged"))
    machine.node.on_notification("agent-stranger", encode(machine._done(msg)))
    assert refused(machine, "foreign") == 2
    assert machine.node.failover.current(msg.request_id, msg.attempt) is not None
    machine.deliver_done(key)
    machine.teardown()
    assert machine.records["r0"][-1]["finish_reason"] == "length"
