"""The prefill worker under random interleavings, isolated from the model and the network.

A test-only runner samples a token that depends only on the prompt, and a test-only agent
posts writes that stay in flight until the machine completes or fails them. Requests with
shared prefixes arrive, run in chunks, and are aborted, pass their deadlines, have a write
refused or lose one in flight, in any order. After every action: the block census balances,
no source block of a write in flight is free (it could be reused under the write), and each
job has at most one result, sent only once none of its writes is in flight. At the end every
job has had its answer and no block is held.
"""

from __future__ import annotations

import functools
import time
import zlib
from collections.abc import Callable
from types import SimpleNamespace

import hypothesis.strategies as st
import torch
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from prometheus_client import CollectorRegistry

from tandem.engine.core.config import SchedulerConfig
from tandem.engine.core.kv_cache_manager import KVCacheManager
from tandem.engine.core.sampling_params import SamplingParams
from tandem.engine.core.scheduler import ModelRunnerOutput, Scheduler
from tandem.engine.core.step_plan import StepPlan
from tandem.engine.exec.request_state import RequestStates
from tandem.engine.telemetry.metrics import NodeMetrics
from tandem.engine.telemetry.step_log import StepLog
from tandem.engine.transfer.messages import (
    AbortAck,
    AbortPrefill,
    AgentInfo,
    KVLayout,
    PrefillDone,
    PrefillFailed,
    PrefillRequest,
    decode_done,
)
from tandem.engine.transfer.nixl_agent import Transfer
from tandem.node.core import NodeCore
from tandem.prefill_node.node import PrefillNode
from tests.engine.test_scheduler import VOCAB
from tests.engine.test_scheduler_machine import PREFIX_LEN, shared_prefix_prompt

BLOCK_SIZE, NUM_BLOCKS = 4, 12
MAX_TAIL = 12  # prompts of 8-20 tokens: 2-5 blocks
PEER = b"decode-identity"
# Deadlines pass when a rule says so, never because the machine was slow to run the steps.
NEVER_S = 10.0**9


def first_token(prompt: list[int]) -> int:
    return zlib.crc32(",".join(map(str, prompt)).encode()) % VOCAB


class PromptRunner:
    """Samples `first_token(prompt)` once a request's prompt is complete; calls `during`
    (if set) as if the step took that long. Keeps the requests' states from the plans as the
    real runner does."""

    def __init__(self) -> None:
        self.during: Callable[[], None] | None = None
        self.requests = RequestStates(torch.device("cpu"))

    def execute(self, plan: StepPlan) -> ModelRunnerOutput:
        if self.during is not None:
            self.during()
        tokens: list[int | None] = []
        for state, n in zip(self.requests.update(plan), plan.num_scheduled_tokens):
            token = None
            if state.num_computed_tokens + n == state.num_tokens:
                num_prompt = state.num_tokens - state.num_output_tokens
                token = first_token(state.all_token_ids[:num_prompt])
                state.append_token(token)
            tokens.append(token)
        return ModelRunnerOutput(tokens, [None] * len(tokens))


class HeldWrites:
    """Stands where the NIXL agent does: writes stay in flight until the test ends them."""

    def __init__(self) -> None:
        self.layout = KVLayout(0, 1024, NUM_BLOCKS, 0, "DRAM")
        self.writes: list[tuple[Transfer, list[int]]] = []  # (write, source blocks)
        self.notified: list[PrefillDone] = []
        self.refuse_next = False

    node_block_bytes = 1024

    def connect(self, info: AgentInfo, ranks: list[AgentInfo] = ()) -> None:
        pass

    def check_peer(self, name: str) -> None:
        pass

    def head_ranges(self) -> list[tuple[int, int]]:
        return [(0, 1)]

    def remote_layout(self, name: str) -> KVLayout:
        return KVLayout(0, 1024, 64, 0, "DRAM")

    def write_blocks(self, name: str, src: list[int], dst: list[int]) -> Transfer:
        if self.refuse_next:
            self.refuse_next = False
            raise RuntimeError("remote agent unreachable")
        transfer = Transfer(None, len(src), 1024 * len(src), 1, time.monotonic())
        self.writes.append((transfer, list(src)))
        return transfer

    def poll(self, transfer: Transfer) -> str:
        return transfer.state

    def notify(self, name: str, payload: bytes) -> None:
        self.notified.append(decode_done(payload))

    def in_flight(self) -> list[tuple[Transfer, list[int]]]:
        return [(t, src) for t, src in self.writes if t.state == "PROC"]


class PrefillNodeMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        kv = KVCacheManager(block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS)
        self.agent = HeldWrites()
        self.runner = PromptRunner()
        config = SimpleNamespace(
            scheduler=SchedulerConfig(8, 3, 64),
            model=SimpleNamespace(vocab_size=VOCAB, eos_token_ids=()),
            device="cpu",
        )
        core = SimpleNamespace(
            config=config,
            kv=kv,
            scheduler=Scheduler(config.scheduler, kv),
            runner=self.runner,
            agent=self.agent,
            metrics=NodeMetrics(CollectorRegistry(), "m", "prefill", "p"),
        )
        core.steps = StepLog()
        core.execute = functools.partial(NodeCore.execute, core)  # the real one, on the fakes
        self.replies: list[AbortAck | PrefillFailed] = []
        self.node = PrefillNode(core, lambda peer, msg: self.replies.append(msg))
        self.prompts: dict[str, list[int]] = {}
        self.owner: dict[int, str] = {}  # id(write) -> job key
        self.count = 0

    def answers(self, request_id: str) -> list[object]:
        sent = [*self.replies, *self.agent.notified]
        return [m for m in sent if m.request_id == request_id]

    @rule(prefix=st.integers(0, 2), tail=st.integers(0, MAX_TAIL), data=st.data())
    def submit(self, prefix: int, tail: int, data: st.DataObject) -> None:
        num_blocks = -(-(PREFIX_LEN + tail) // BLOCK_SIZE)
        self.submit_prompt(prefix, tail, data.draw(st.integers(0, num_blocks - 1), "skip"))

    def submit_prompt(self, prefix: int, tail: int, skip: int) -> str:
        """A PrefillRequest whose first `skip` blocks the decode node already has."""
        prompt = shared_prefix_prompt(prefix, tail, self.count)
        request_id = f"r{self.count}"
        self.count += 1
        num_blocks = -(-len(prompt) // BLOCK_SIZE)
        msg = PrefillRequest(
            request_id=request_id,
            attempt=1,
            token_ids=prompt,
            sampling=SamplingParams(),
            skip_blocks=skip,
            dst_block_ids=list(range(skip, num_blocks)),
            agent=AgentInfo("decode", b"", self.agent.remote_layout("decode")),
            deadline_s=NEVER_S,
            sent_at=time.time(),
        )
        self.node.submit(PEER, msg)
        self.prompts[request_id] = prompt
        return request_id

    @rule(
        rounds=st.integers(1, 3),
        refuse=st.sampled_from([False, False, False, True]),
        slow=st.sampled_from([False, False, False, True]),
    )
    def step(self, rounds: int = 1, refuse: bool = False, slow: bool = False) -> None:
        """`rounds` turns of the node's loop (a step, then a poll of the writes). `refuse`:
        the first write they post is refused (the peer is unreachable). `slow`: the model
        runs past every job's deadline."""
        self.agent.refuse_next = refuse
        self.runner.during = self._pass_every_deadline if slow else None
        for _ in range(rounds):
            self.node.step()
            self._record_owners()
            self.node.poll()
        self.agent.refuse_next = False
        self.runner.during = None

    def _pass_every_deadline(self) -> None:
        for job in self.node.jobs.values():
            job.deadline = 0.0

    def _record_owners(self) -> None:
        for job in self.node.jobs.values():
            for transfer, _ in job.transfers:
                self.owner[id(transfer)] = job.msg.request_id

    @rule()
    def poll(self) -> None:
        self.node.poll()

    @precondition(lambda self: self.agent.in_flight())
    @rule(data=st.data(), ok=st.booleans())
    def write_ends(self, data: st.DataObject, ok: bool) -> None:
        transfer, _ = data.draw(st.sampled_from(self.agent.in_flight()))
        transfer.state = "DONE" if ok else "ERR"

    @precondition(lambda self: self.node.jobs)
    @rule(data=st.data())
    def deadline_passes(self, data: st.DataObject) -> None:
        """No write of the job may start from now on."""
        self.node.jobs[data.draw(st.sampled_from(sorted(self.node.jobs)))].deadline = 0.0

    @precondition(lambda self: self.prompts)
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        """Also for jobs already answered: the worker must then ack at once."""
        request_id = data.draw(st.sampled_from(sorted(self.prompts)))
        self.node.abort(PEER, AbortPrefill(request_id, 1, "decode"))

    @invariant()
    def no_write_reads_a_free_block(self) -> None:
        kv = self.node.core.kv
        kv.check_integrity()
        for _, src in self.agent.in_flight():
            free = [b for b in src if kv.pool.blocks[b].ref_cnt == 0]
            assert not free, f"blocks {free} are free while a write reads them"

    @invariant()
    def answers_come_once_and_after_the_writes(self) -> None:
        in_flight = {self.owner.get(id(t)) for t, _ in self.agent.in_flight()}
        for request_id, prompt in self.prompts.items():
            answers = self.answers(request_id)
            if answers:  # an ack too: the decode node reuses the blocks when it hears one
                assert request_id not in in_flight, f"{request_id} answered mid-write"
            # Acks may repeat (an abort after the answer is acked at once); results may not.
            results = [a for a in answers if not isinstance(a, AbortAck)]
            assert len(results) <= 1, results
            if results and isinstance(results[0], PrefillDone):
                assert results[0].token_id == first_token(prompt)

    def teardown(self) -> None:
        for _ in range(200):  # far more rounds than the queued work needs
            for transfer, _ in self.agent.in_flight():
                transfer.state = "DONE"
            self.step()
            if not self.node.jobs:
                break
        assert not self.node.jobs, "jobs never settle"
        kv = self.node.core.kv
        assert kv.check_integrity().in_use == 0 and not kv.hold_keys()
        for request_id in self.prompts:
            assert self.answers(request_id), f"{request_id} never answered"


PrefillNodeMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None
)
test_prefill_node_state_machine = PrefillNodeMachine.TestCase


def test_a_job_that_fails_in_the_step_that_completes_its_prompt_ends_cleanly():
    """The write of the last chunk is refused, or the deadline passes while the model runs:
    the job ends after the batch is done with its request (found by the machine above: the
    worker used to abort the request mid-step, and the step then failed on it)."""
    for failure in ("refused", "deadline"):
        machine = PrefillNodeMachine()
        request_id = machine.submit_prompt(prefix=0, tail=0, skip=0)  # 2 blocks, one chunk
        if failure == "refused":
            machine.agent.refuse_next = True
        else:
            machine.runner.during = machine._pass_every_deadline
        machine.node.step()
        machine.node.poll()
        expected = "transfer" if failure == "refused" else "deadline"
        assert machine.replies == [PrefillFailed(request_id, 1, expected)], failure
        assert not machine.node.jobs and not machine.agent.notified
        assert machine.node.core.kv.check_integrity().in_use == 0
