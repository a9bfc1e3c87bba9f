"""The prefill worker's write path in isolation: NIXL reads the KV only after the step's
kernels wrote it, a first-token notification that cannot be sent still answers the decode
node (it would otherwise wait out its whole prefill deadline), and a busy worker notifies a
finished job when its last write lands rather than after its next step, without waiting
for a write that does not land."""

from __future__ import annotations

import threading

from prometheus_client import generate_latest

from tandem.engine.core.scheduler import ModelRunnerOutput
from tandem.engine.core.step_plan import StepPlan
from tandem.engine.transfer.messages import PrefillFailed
from tandem.engine.transfer.nixl_agent import Transfer
from tests.bounds import HANG_S
from tests.disagg.nodes import metric_value
from tests.disagg.test_prefill_node_machine import HeldWrites, PrefillNodeMachine, PromptRunner


class LoggedEvent:
    """Stands for the step's device event: records when the host waited on it."""

    def __init__(self, log: list[str], step: int) -> None:
        self.log, self.step = log, step

    def wait(self) -> None:
        self.log.append(f"wait {self.step}")


class EventRunner(PromptRunner):
    """Each step returns an event of its own; the log shows which one a write waited on."""

    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log, self.steps = log, 0

    def execute(self, plan: StepPlan) -> ModelRunnerOutput:
        result = super().execute(plan)
        self.steps += 1
        self.log.append(f"step {self.steps}")
        result.kv_written = LoggedEvent(self.log, self.steps)
        return result


class LoggedWrites(HeldWrites):
    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log

    def write_blocks(self, name, src, dst):
        self.log.append(f"write {src}")
        return super().write_blocks(name, src, dst)


class LandingWrites(LoggedWrites):
    """A write lands when the worker polls it for the second time (`lands_at`), or never
    (None); notifications go into the log."""

    def __init__(self, log: list[str], lands_at: int | None) -> None:
        super().__init__(log)
        self.lands_at = lands_at
        self.polls: dict[int, int] = {}

    def poll(self, transfer: Transfer) -> str:
        count = self.polls[id(transfer)] = self.polls.get(id(transfer), 0) + 1
        if transfer.state == "PROC" and count == self.lands_at:
            transfer.state = "DONE"
        return transfer.state

    def notify(self, name: str, payload: bytes) -> None:
        super().notify(name, payload)
        self.log.append(f"notify {self.notified[-1].request_id}")


class UnreachableDecode(HeldWrites):
    def notify(self, name: str, payload: bytes) -> None:
        raise RuntimeError("remote agent unreachable")


def machine_with(agent: HeldWrites, runner: PromptRunner | None = None) -> PrefillNodeMachine:
    machine = PrefillNodeMachine()
    machine.agent = machine.node.core.agent = agent
    if runner is not None:
        machine.runner = machine.node.core.runner = runner
    return machine


def test_every_write_waits_for_the_step_that_computed_its_blocks():
    log: list[str] = []
    machine = machine_with(LoggedWrites(log), EventRunner(log))
    # 20 prompt tokens in chunks of 8 (the budget): middle chunks sample nothing, so on a
    # GPU nothing else would synchronize before their writes.
    machine.submit_prompt(prefix=0, tail=12, skip=0)
    for _ in range(3):
        machine.node.step()
    writes = [i for i, entry in enumerate(log) if entry.startswith("write")]
    assert len(writes) == 3, log
    for i in writes:
        step = next(e for e in reversed(log[:i]) if e.startswith("step"))
        assert f"wait {step.split()[1]}" in log[log.index(step) : i], log


def test_a_failed_first_token_notification_fails_the_job_and_is_counted():
    machine = machine_with(UnreachableDecode())
    request_id = machine.submit_prompt(prefix=0, tail=0, skip=0)  # 2 blocks, one chunk
    machine.node.step()
    for transfer, _ in machine.agent.in_flight():
        transfer.state = "DONE"
    machine.node.poll()
    assert machine.replies == [PrefillFailed(request_id, 1, "notify")]
    assert not machine.node.jobs
    kv = machine.node.core.kv
    assert kv.check_integrity().in_use == 0 and not kv.hold_keys()
    text = generate_latest(machine.node.core.metrics.registry).decode()
    assert metric_value(text, "tandem_kv_transfer_failures_total", reason="notify") == 1


def two_prompts_one_step_each(
    agent: LandingWrites, log: list[str]
) -> tuple[PrefillNodeMachine, str, str]:
    """A worker on `agent` given two prompts of 8 tokens (the step's budget): the first runs
    in step 1, the second waits for step 2."""
    machine = machine_with(agent, EventRunner(log))
    first = machine.submit_prompt(prefix=0, tail=0, skip=0)
    second = machine.submit_prompt(prefix=1, tail=0, skip=0)
    return machine, first, second


def bounded(call) -> None:
    """`call()`, failing instead of hanging (it must return on its own)."""
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(HANG_S)
    assert not thread.is_alive(), "the worker waited without bound"


def test_a_busy_worker_notifies_a_finished_job_before_its_next_step():
    log: list[str] = []
    agent = LandingWrites(log, lands_at=2)  # still in flight when the step's poll first looks
    machine, first, second = two_prompts_one_step_each(agent, log)
    for _ in range(2):  # the node's loop: a step, then a poll of the writes
        bounded(machine.node.step)
        machine.node.poll()
    assert log.index(f"notify {first}") < log.index("step 2"), log
    # the step log gives the wait apart: step 2 waited, step 1 had nothing to wait for
    one, two = machine.node.core.steps.since()
    assert one["writes_wait_s"] == 0 < two["writes_wait_s"] <= one["tail_s"]
    machine.node.poll()  # idle now: the loop polls again within a millisecond
    assert f"notify {second}" in log and not machine.node.jobs
    assert machine.node.core.kv.check_integrity().in_use == 0


def test_a_busy_worker_does_not_wait_for_a_write_that_does_not_land():
    log: list[str] = []
    agent = LandingWrites(log, lands_at=None)
    machine, first, second = two_prompts_one_step_each(agent, log)
    machine.node.step()
    machine.node.poll()
    bounded(machine.node.step)  # gives up on the write after a while, and runs the batch
    assert "step 2" in log and not agent.notified
    assert agent.writes[0][0].state == "PROC"
    for transfer, _ in agent.writes:
        transfer.state = "DONE"
    machine.node.poll()
    assert [d.request_id for d in agent.notified] == [first, second]
    assert not machine.node.jobs and machine.node.core.kv.check_integrity().in_use == 0


class FirstWriteStuck(LandingWrites):
    """The first write never lands; the others land at their second poll."""

    def poll(self, transfer: Transfer) -> str:
        if transfer is self.writes[0][0]:
            self.polls[id(transfer)] = self.polls.get(id(transfer), 0) + 1
            return transfer.state
        return super().poll(transfer)


def test_a_write_that_does_not_land_is_waited_for_once_not_before_every_step():
    log: list[str] = []
    agent = FirstWriteStuck(log, lands_at=2)
    machine, first, second = two_prompts_one_step_each(agent, log)
    machine.node.step()
    machine.node.poll()
    bounded(machine.node.step)  # step 2: waits for the first job's write, in vain
    machine.node.poll()
    machine.node.poll()  # the second job's write lands at its second poll
    assert f"notify {second}" in log and len(machine.node.jobs) == 1  # the first
    third = machine.submit_prompt(prefix=2, tail=0, skip=0)
    stuck = agent.writes[0][0]
    polls = agent.polls[id(stuck)]
    bounded(machine.node.step)  # step 3: nothing it has not waited for already
    assert "step 3" in log and agent.polls[id(stuck)] == polls, log
    stuck.state = "DONE"
    for _ in range(3):
        machine.node.poll()
    assert f"notify {first}" in log and f"notify {third}" in log
    assert not machine.node.jobs and machine.node.core.kv.check_integrity().in_use == 0
