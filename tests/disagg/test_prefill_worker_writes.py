"""The prefill worker's write path in isolation: NIXL reads the KV only after the step's
kernels wrote it, and a first-token notification that cannot be sent still answers the
decode node (it would otherwise wait out its whole prefill deadline)."""

from __future__ import annotations

from prometheus_client import generate_latest

from tandem.engine.kv_transfer import PrefillFailed
from tandem.engine.scheduler import ModelRunnerOutput, SchedulerOutput
from tests.disagg.nodes import metric_value
from tests.disagg.test_prefill_worker_machine import HeldWrites, PrefillWorkerMachine, PromptRunner


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

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        result = super().execute(out)
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


class UnreachableDecode(HeldWrites):
    def notify(self, name: str, payload: bytes) -> None:
        raise RuntimeError("remote agent unreachable")


def machine_with(agent: HeldWrites, runner: PromptRunner | None = None) -> PrefillWorkerMachine:
    machine = PrefillWorkerMachine()
    machine.agent = machine.worker.core.agent = agent
    if runner is not None:
        machine.runner = machine.worker.core.runner = runner
    return machine


def test_every_write_waits_for_the_step_that_computed_its_blocks():
    log: list[str] = []
    machine = machine_with(LoggedWrites(log), EventRunner(log))
    # 20 prompt tokens in chunks of 8 (the budget): middle chunks sample nothing, so on a
    # GPU nothing else would synchronize before their writes.
    machine.submit_prompt(prefix=0, tail=12, skip=0)
    for _ in range(3):
        machine.worker.step()
    writes = [i for i, entry in enumerate(log) if entry.startswith("write")]
    assert len(writes) == 3, log
    for i in writes:
        step = next(e for e in reversed(log[:i]) if e.startswith("step"))
        assert f"wait {step.split()[1]}" in log[log.index(step) : i], log


def test_a_failed_first_token_notification_fails_the_job_and_is_counted():
    machine = machine_with(UnreachableDecode())
    request_id = machine.submit_prompt(prefix=0, tail=0, skip=0)  # 2 blocks, one chunk
    machine.worker.step()
    for transfer, _ in machine.agent.in_flight():
        transfer.state = "DONE"
    machine.worker.poll()
    assert machine.replies == [PrefillFailed(request_id, 1, "notify")]
    assert not machine.worker.jobs
    kv = machine.worker.core.kv
    assert kv.check_integrity().in_use == 0 and not kv.hold_keys()
    text = generate_latest(machine.worker.core.metrics.registry).decode()
    assert metric_value(text, "tandem_kv_transfer_failures_total", reason="notify") == 1
