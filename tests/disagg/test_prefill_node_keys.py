"""The prefill worker keys its jobs by the decode node as well as the attempt: the router
retries a failed request on another decode node under the same request id, and that node
numbers its attempts from 1 again, so two decode nodes may send `request_id@1` while the
first one's job is still on the worker. Each is prefilled into its own node's blocks, an
abort ends only the aborting node's job, and a repeat from the same node is refused."""

from __future__ import annotations

import time

from tandem.engine.core.sampling_params import SamplingParams
from tandem.engine.transfer.messages import (
    AbortAck,
    AbortPrefill,
    AgentInfo,
    PrefillFailed,
    PrefillRequest,
)
from tandem.engine.transfer.nixl_agent import Transfer
from tests.disagg.test_prefill_node_machine import (
    NEVER_S,
    HeldWrites,
    PrefillNodeMachine,
    first_token,
)
from tests.engine.test_scheduler_machine import shared_prefix_prompt

PROMPT = shared_prefix_prompt(0, 0, 0)  # 8 tokens: 2 blocks of 4, one step's budget
DEAD, RETRY = ("decode-a", b"peer-a"), ("decode-b", b"peer-b")


class NamedWrites(HeldWrites):
    """Records which decode agent each write and notification went to."""

    def __init__(self) -> None:
        super().__init__()
        self.targets: list[tuple[str, list[int]]] = []  # (agent, destination blocks)
        self.notified_to: list[tuple[str, str]] = []  # (agent, request id)

    def write_blocks(self, name: str, src: list[int], dst: list[int]) -> Transfer:
        transfer = super().write_blocks(name, src, dst)
        self.targets.append((name, list(dst)))
        return transfer

    def notify(self, name: str, payload: bytes) -> None:
        super().notify(name, payload)
        self.notified_to.append((name, self.notified[-1].request_id))


class Prefill:
    """A prefill node on test-only writes, with the peer of every control reply."""

    def __init__(self) -> None:
        self.machine = PrefillNodeMachine()
        self.agent = NamedWrites()
        self.machine.agent = self.machine.node.core.agent = self.agent
        self.node = self.machine.node
        self.replies: list[tuple[bytes, object]] = []
        self.node.reply = lambda peer, msg: self.replies.append((peer, msg))

    def submit(self, node: tuple[str, bytes], dst: list[int], request_id: str = "r") -> None:
        name, peer = node
        layout = self.agent.remote_layout(name)
        msg = PrefillRequest(
            request_id,
            1,
            PROMPT,
            SamplingParams(),
            0,
            dst,
            AgentInfo(name, b"", layout),
            NEVER_S,
            time.time(),
        )
        self.node.submit(peer, msg)

    def run(self) -> None:
        """Steps and polls, every write landing, until no job is left."""
        for _ in range(20):  # far more than one prompt of one chunk needs
            self.node.step()
            for transfer, _ in self.agent.in_flight():
                transfer.state = "DONE"
            self.node.poll()
            if not self.node.jobs:
                return
        raise AssertionError(f"jobs never settle: {self.node.report()}")

    def assert_clean(self) -> None:
        kv = self.node.core.kv
        assert kv.check_integrity().in_use == 0 and not kv.hold_keys()


def test_the_same_attempt_from_two_decode_nodes_is_prefilled_for_each():
    w = Prefill()
    w.submit(DEAD, [0, 1])
    w.submit(RETRY, [7, 8])
    assert len(w.node.jobs) == 2 and not w.replies
    w.run()
    assert sorted(w.agent.targets) == [("decode-a", [0, 1]), ("decode-b", [7, 8])]
    assert sorted(w.agent.notified_to) == [("decode-a", "r"), ("decode-b", "r")]
    assert all(done.token_id == first_token(PROMPT) for done in w.agent.notified)
    w.assert_clean()


def test_a_repeat_from_the_same_decode_node_is_refused_and_the_first_goes_on():
    w = Prefill()
    w.submit(DEAD, [0, 1])
    w.submit(RETRY, [7, 8])
    w.submit(DEAD, [3, 4])
    assert len(w.replies) == 1
    peer, failed = w.replies[0]
    assert peer == DEAD[1] and isinstance(failed, PrefillFailed)
    assert (failed.request_id, failed.attempt) == ("r", 1)
    assert "already being prefilled" in failed.reason
    w.run()
    assert sorted(w.agent.targets) == [("decode-a", [0, 1]), ("decode-b", [7, 8])]
    assert sorted(w.agent.notified_to) == [("decode-a", "r"), ("decode-b", "r")]
    w.assert_clean()


def test_an_abort_ends_only_the_aborting_node_s_job():
    w = Prefill()
    w.submit(DEAD, [0, 1])
    w.submit(RETRY, [7, 8])
    w.node.step()
    w.node.step()  # one prompt a step: both jobs' writes are in flight
    assert len(w.agent.in_flight()) == 2
    w.node.abort(DEAD[1], AbortPrefill("r", 1, DEAD[0]))
    w.node.poll()
    assert not w.replies  # the aborted job's write is still in flight: no answer yet
    w.run()
    assert w.replies == [(DEAD[1], AbortAck("r", 1))]
    assert w.agent.notified_to == [("decode-b", "r")]
    w.assert_clean()


def test_an_abort_is_answered_on_the_connection_it_came_from():
    """A decode node that reconnected has a new ZMQ identity; its agent name is the same."""
    w = Prefill()
    w.submit(DEAD, [0, 1])
    w.node.step()
    w.node.abort(b"peer-a-reconnected", AbortPrefill("r", 1, DEAD[0]))
    w.run()
    assert w.replies == [(b"peer-a-reconnected", AbortAck("r", 1))]
    assert not w.agent.notified
    w.assert_clean()
