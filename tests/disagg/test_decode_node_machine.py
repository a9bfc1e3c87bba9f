"""The decode worker under random interleavings, isolated from the model and the network.

Requests arrive for local or remote prefill (with an alternate worker); prefill workers
answer, fail, confirm aborts or answer late, in any order; workers become unreachable;
deadlines and hold timeouts pass; clients abort. A test-only runner samples a token that
depends only on the sequence so far, and so do the simulated prefill workers, so every
stream must carry exactly the tokens the request would have had alone.

After every action: the block census balances, no block belongs to a request that is not
running or waiting for its remote KV, and no destination block of an attempt whose worker
may still write is owned by anyone but that attempt. At the end every stream has had exactly
one final record and no block is held.
"""

from __future__ import annotations

import functools
import logging
from types import SimpleNamespace

import hypothesis.strategies as st
import msgspec
import torch
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from prometheus_client import CollectorRegistry

from tandem.decode_node.node import DecodeNode, DecodeOptions, GenerateInput
from tandem.engine.core.config import SchedulerConfig
from tandem.engine.core.kv_cache_manager import KVCacheManager
from tandem.engine.core.sampling_params import SamplingParams
from tandem.engine.core.scheduler import ModelRunnerOutput, Scheduler, remote_hold_key
from tandem.engine.core.step_plan import StepPlan
from tandem.engine.exec.request_state import RequestStates
from tandem.engine.telemetry.metrics import NodeMetrics
from tandem.engine.telemetry.request_log import RequestIdFilter
from tandem.engine.telemetry.step_log import StepLog
from tandem.engine.transfer.messages import (
    AbortAck,
    AbortPrefill,
    AgentInfo,
    KVLayout,
    PrefillDone,
    PrefillFailed,
    PrefillRequest,
    encode,
)
from tandem.node.core import NodeCore
from tests.engine.test_scheduler import VOCAB, fake_token
from tests.engine.test_scheduler_machine import shared_prefix_prompt, tokens_alone

BLOCK_SIZE, NUM_BLOCKS = 4, 9
MAX_TAIL, MAX_OUTPUT = 10, 6
WORKERS = ("tcp://p1", "tcp://p2")
# Deadlines pass when a rule says so, never because the machine was slow to run the steps.
NEVER_S = 10.0**9


class Runner:
    """Samples what `fake_run` would, from its own copies of the requests, kept from the
    plans as the real runner keeps them."""

    def __init__(self) -> None:
        self.requests = RequestStates(torch.device("cpu"))

    def execute(self, plan: StepPlan) -> ModelRunnerOutput:
        tokens: list[int | None] = []
        for state, n in zip(self.requests.update(plan), plan.num_scheduled_tokens):
            token = None
            if state.num_computed_tokens + n == state.num_tokens:
                token = fake_token(state.all_token_ids)
                state.append_token(token)
            tokens.append(token)
        return ModelRunnerOutput(tokens, [None] * len(tokens))


class Tokenizer:
    """Token ids as text: all the detokenizer needs without stop strings."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(f"<{i}>" for i in ids)


class Client:
    """Records what the decode worker sends; `down` endpoints are not connected."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, msgspec.Struct]] = []
        self.down: set[str] = set()

    def send(self, endpoint: str, message: msgspec.Struct) -> bool:
        if endpoint in self.down:
            return False
        self.sent.append((endpoint, message))
        return True

    def agent_of(self, endpoint: str) -> str:
        return f"agent-{endpoint}"


class DecodeNodeMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        layout = KVLayout(0, 1024, NUM_BLOCKS, 0, "DRAM")
        kv = KVCacheManager(block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS)
        config = SimpleNamespace(
            model=SimpleNamespace(vocab_size=VOCAB, eos_token_ids=()),
            scheduler=SchedulerConfig(12, 3, 64),
            cache=SimpleNamespace(block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS),
            device="cpu",
        )
        core = SimpleNamespace(
            config=config,
            kv=kv,
            scheduler=Scheduler(config.scheduler, kv),
            runner=Runner(),
            agent=SimpleNamespace(
                info=lambda: AgentInfo("decode", b"", layout), rank_infos=lambda: []
            ),
            metrics=NodeMetrics(CollectorRegistry(), "m", "decode", "d"),
        )
        core.steps = StepLog()
        core.execute = functools.partial(NodeCore.execute, core)  # the real one, on the fakes
        self.client = Client()
        options = DecodeOptions(prefill_timeout_s=NEVER_S, hold_timeout_s=NEVER_S)
        self.node = DecodeNode(core, self.client, Tokenizer(), options)
        self.expected: dict[str, list[int]] = {}
        self.records: dict[str, list[dict]] = {}
        # Attempts sent and not yet answered (hold key -> the PrefillRequest): their worker
        # may still write into the destination blocks.
        self.may_write: dict[str, PrefillRequest] = {}
        self.writers: dict[str, str] = {}  # hold key -> the endpoint its request went to
        self.count = 0

    # -- clients ----------------------------------------------------------------------------

    @rule(
        prefix=st.integers(0, 2),
        tail=st.integers(0, MAX_TAIL),
        max_tokens=st.integers(1, MAX_OUTPUT),
        remote=st.booleans(),
    )
    def add(self, prefix: int, tail: int, max_tokens: int, remote: bool) -> None:
        prompt = shared_prefix_prompt(prefix, tail, self.count)
        request_id = f"r{self.count}"
        self.count += 1
        self.records[request_id] = []
        inp = GenerateInput(
            request_id,
            prompt,
            SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0),
            prefill=WORKERS[0] if remote else None,
            prefill_alternates=list(WORKERS) if remote else [],
            log_id=f"client-{request_id}",
        )
        self.node.add(inp, self.records[request_id].append)
        self.expected[request_id] = tokens_alone(prompt, max_tokens)

    @precondition(lambda self: self.node.streams)
    @rule(data=st.data())
    def client_aborts(self, data: st.DataObject) -> None:
        self.node.abort(data.draw(st.sampled_from(sorted(self.node.streams))))

    # -- the engine loop --------------------------------------------------------------------

    @rule()
    def step(self) -> None:
        before = len(self.client.sent)
        self.node.step()
        for endpoint, msg in self.client.sent[before:]:
            if isinstance(msg, PrefillRequest):
                key = remote_hold_key(msg.request_id, msg.attempt)
                self.may_write[key] = msg
                self.writers[key] = endpoint

    # -- prefill workers --------------------------------------------------------------------

    @precondition(lambda self: self.may_write)
    @rule(data=st.data())
    def prefill_done(self, data: st.DataObject) -> None:
        self.deliver_done(data.draw(st.sampled_from(sorted(self.may_write))))

    def deliver_done(self, key: str) -> None:
        """The worker wrote every block, then notified (late, for an abandoned attempt)."""
        msg = self.may_write.pop(key)
        agent = self.client.agent_of(self.writers[key])
        self.node.on_notification(agent, encode(self._done(msg)))

    @precondition(lambda self: self.may_write)
    @rule(data=st.data())
    def prefill_fails(self, data: st.DataObject) -> None:
        """Reported once none of the attempt's writes is in flight."""
        key = data.draw(st.sampled_from(sorted(self.may_write)))
        msg = self.may_write.pop(key)
        failed = PrefillFailed(msg.request_id, msg.attempt, "error")
        self.node.on_reply(self.writers[key], failed)

    @precondition(lambda self: self._aborted_attempts())
    @rule(data=st.data())
    def prefill_confirms_abort(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(self._aborted_attempts()))
        msg = self.may_write.pop(key)
        self.node.on_reply(self.writers[key], AbortAck(msg.request_id, msg.attempt))

    @precondition(lambda self: self.may_write)
    @rule(data=st.data())
    def another_worker_answers_for_it(self, data: st.DataObject) -> None:
        """A paired worker (or a NIXL agent) that the attempt did not go to fails it,
        confirms its abort, or completes it: nothing changes."""
        key = data.draw(st.sampled_from(sorted(self.may_write)))
        msg = self.may_write[key]
        other = next(w for w in WORKERS if w != self.writers[key])
        before = self.node.failover.worker_of(msg.request_id, msg.attempt)
        held = self.node.core.kv.hold_keys()
        self.node.on_reply(other, PrefillFailed(msg.request_id, msg.attempt, "error"))
        self.node.on_reply(other, AbortAck(msg.request_id, msg.attempt))
        self.node.on_notification(self.client.agent_of(other), encode(self._done(msg)))
        assert self.node.failover.worker_of(msg.request_id, msg.attempt) == before
        assert self.node.core.kv.hold_keys() == held

    @rule(endpoint=st.sampled_from(WORKERS), up=st.booleans())
    def connectivity(self, endpoint: str, up: bool) -> None:
        (self.client.down.discard if up else self.client.down.add)(endpoint)

    @precondition(lambda self: self.node.core.scheduler.remote)
    @rule(data=st.data())
    def prefill_deadline_passes(self, data: st.DataObject) -> None:
        remote = self.node.core.scheduler.remote
        self.node.failover.attempts[data.draw(st.sampled_from(sorted(remote)))].deadline = 0.0
        self.step()

    @precondition(lambda self: self.node.failover.hold_deadlines)
    @rule(data=st.data())
    def hold_times_out(self, data: st.DataObject) -> None:
        """A write posted before may still land after the timeout (a stopped worker): the
        hold is quarantined, and the invariants hold with the worker still writing."""
        key = data.draw(st.sampled_from(sorted(self.node.failover.hold_deadlines)))
        self.node.failover.hold_deadlines[key] = 0.0

    @rule(endpoint=st.sampled_from(WORKERS))
    def prefill_worker_dies(self, endpoint: str) -> None:
        """Its connection drops: nothing it posted lands any more."""
        self.node.on_disconnect(endpoint)
        for key in [k for k, e in self.writers.items() if e == endpoint]:
            self.may_write.pop(key, None)
            del self.writers[key]

    def _aborted_attempts(self) -> list[str]:
        aborts = {
            remote_hold_key(m.request_id, m.attempt)
            for _, m in self.client.sent
            if isinstance(m, AbortPrefill)
        }
        return sorted(aborts & self.may_write.keys())

    def _done(self, msg: PrefillRequest) -> PrefillDone:
        first = self.expected[msg.request_id][0]
        return PrefillDone(msg.request_id, msg.attempt, first, None, 1, 1024, 0.0, 0.0)

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def blocks_balance(self) -> None:
        scheduler = self.node.core.scheduler
        kv = scheduler.kv
        kv.check_integrity()
        owners = {r.request_id for r in scheduler.running} | scheduler.remote.keys()
        for request_id in self.expected.keys() - owners:
            assert kv.block_ids(request_id) == [], f"{request_id} keeps blocks it cannot use"

    @invariant()
    def nothing_lands_in_a_block_someone_else_owns(self) -> None:
        scheduler = self.node.core.scheduler
        for key, msg in self.may_write.items():
            request = scheduler.remote.get(msg.request_id)
            current = request is not None and request.num_remote_attempts == msg.attempt
            for owner in [*scheduler.running, *scheduler.remote.values()]:
                if current and owner is request:
                    continue
                shared = set(msg.dst_block_ids) & set(scheduler.kv.block_ids(owner.request_id))
                assert not shared, f"{key} may still write into {shared}, now {owner}'s"

    @invariant()
    def streams_carry_the_tokens_alone(self) -> None:
        for request_id, records in self.records.items():
            tokens = [t for r in records for t in r["token_ids"]]
            assert tokens == self.expected[request_id][: len(tokens)], request_id
            finals = [r for r in records if r["finish_reason"] is not None]
            assert len(finals) <= 1 and (not finals or records[-1] is finals[0])
            assert bool(finals) != (request_id in self.node.streams)

    def teardown(self) -> None:
        self.client.down.clear()
        for _ in range(200):  # far more rounds than the queued work needs
            for key in sorted(self.may_write):
                msg = self.may_write.pop(key)
                request = self.node.core.scheduler.remote.get(msg.request_id)
                writer = self.writers[key]
                if request is not None and request.num_remote_attempts == msg.attempt:
                    agent = self.client.agent_of(writer)
                    self.node.on_notification(agent, encode(self._done(msg)))
                else:
                    self.node.on_reply(writer, AbortAck(msg.request_id, msg.attempt))
            if not self.node.streams and not self.node.core.kv.hold_keys():
                break
            deadlines = self.node.failover.hold_deadlines
            deadlines.update(dict.fromkeys(deadlines, 0.0))  # time passes: a dead writer's
            self.step()  # holds end by their timeout
        assert not self.node.streams, "streams never finish"
        kv = self.node.core.kv
        assert kv.check_integrity().in_use == 0 and not kv.hold_keys()
        assert not self.node.holds.log_ids, "log ids outlive their holds"
        assert not self.node.failover.attempts, "attempts outlive their requests"
        assert not self.node.failover.unconfirmed and not self.node.failover.hold_deadlines
        for request_id, records in self.records.items():
            final = records[-1]
            tokens = [t for r in records for t in r["token_ids"]]
            if final["finish_reason"] == "length":
                assert tokens == self.expected[request_id], request_id
            else:
                assert final["finish_reason"] in ("abort", "error"), final


DecodeNodeMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None
)
test_decode_node_state_machine = DecodeNodeMachine.TestCase


def test_a_late_answer_of_an_abandoned_attempt_completes_nothing():
    """Attempt 1 times out, attempt 2 goes to the alternate; attempt 1's worker then
    finishes after all. Its notification only releases its hold: the request waits for
    attempt 2, whose blocks are still being written."""
    machine = DecodeNodeMachine()
    machine.add(prefix=0, tail=0, max_tokens=3, remote=True)
    machine.step()
    machine.node.failover.attempts["r0"].deadline = 0.0
    machine.step()
    assert sorted(machine.may_write) == ["r0@1", "r0@2"]
    machine.deliver_done("r0@1")
    machine.nothing_lands_in_a_block_someone_else_owns()
    request = machine.node.core.scheduler.remote["r0"]
    assert request.num_remote_attempts == 2 and not machine.node.core.kv.hold_keys()
    machine.teardown()


def test_an_attempt_that_was_never_sent_holds_no_blocks():
    """Both workers unreachable: nothing was queued, so nothing can land, and the blocks
    go back at once rather than after the hold timeout (found by the machine above)."""
    machine = DecodeNodeMachine()
    machine.client.down.update(WORKERS)
    machine.add(prefix=0, tail=9, max_tokens=2, remote=True)
    machine.step()
    kv = machine.node.core.kv
    assert not kv.hold_keys() and not machine.node.failover.hold_deadlines
    machine.step()  # prefilled here
    machine.teardown()
    assert [r["finish_reason"] for r in machine.records["r0"]][-1] == "length"


def test_lines_about_a_hold_that_outlives_its_request_carry_the_request_id(caplog):
    """The client leaves while the prefill worker is silent: the attempt's hold waits for
    it, then times out; that line names the client's request id too."""
    caplog.handler.addFilter(RequestIdFilter())
    caplog.set_level(logging.INFO, logger="tandem.decode_node")
    machine = DecodeNodeMachine()
    machine.add(prefix=0, tail=0, max_tokens=3, remote=True)
    machine.step()  # sent to the prefill worker
    assert machine.node.abort("r0")
    machine.step()  # the abort sent; the hold waits for its answer
    machine.node.failover.hold_deadlines["r0@1"] = 0.0
    machine.step()  # quarantined: the worker may still write
    machine.node.on_reply(WORKERS[0], AbortAck("r0", 1))
    lines = [(r.request_id, r.getMessage()) for r in caplog.records]
    quarantined = "hold r0@1: no confirmation from the prefill worker; quarantining 3 blocks "
    assert (
        "client-r0",
        f"{quarantined}until {WORKERS[0]} confirms or its connection drops",
    ) in lines
    confirmed = "hold r0@1: the prefill worker confirmed late; releasing 3 quarantined blocks"
    assert ("client-r0", confirmed) in lines
    assert [m for rid, m in lines if "r0" in m and rid != "client-r0"] == []
    assert not machine.node.holds.log_ids
    machine.teardown()
