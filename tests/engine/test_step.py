"""The engine step the offline engine and both nodes share (`run_step`): its hooks are
called at their points, with the state each promises."""

from __future__ import annotations

from tandem.engine.core.request import Request
from tandem.engine.core.scheduler import ModelRunnerOutput, SchedulerOutput
from tandem.engine.step import StepHooks, run_step
from tests.engine.test_scheduler import fake_run, make_scheduler, request, run_to_end


class Recorder(StepHooks):
    """Writes down what each hook saw."""

    def __init__(self, scheduler) -> None:
        self.scheduler = scheduler
        self.calls: list[str] = []
        self.computed_before_update: list[int] = []
        self.held_before_update: list[int] = []
        self.finished: list[str] = []

    def before_run(self, out: SchedulerOutput) -> None:
        self.calls.append("before_run")

    def before_update(self, out: SchedulerOutput, result: ModelRunnerOutput) -> None:
        self.calls.append("before_update")
        self.computed_before_update = [r.num_computed_tokens for r in out.scheduled]
        kv = self.scheduler.kv
        self.held_before_update = [len(kv.block_ids(r.request_id)) for r in out.scheduled]

    def after_update(
        self, out: SchedulerOutput, result: ModelRunnerOutput, finished: list[Request]
    ) -> None:
        self.calls.append("after_update")
        self.finished += [r.request_id for r in finished]


def test_an_empty_plan_calls_only_before_run():
    scheduler = make_scheduler()
    hooks = Recorder(scheduler)
    executed = []
    assert not run_step(scheduler, lambda out: executed.append(out), hooks)
    assert hooks.calls == ["before_run"] and not executed


def test_hooks_run_in_order_and_see_the_promised_state():
    scheduler = make_scheduler(block_size=4)
    scheduler.add_request(request("a", 10, max_tokens=1))  # finishes in its first step
    hooks = Recorder(scheduler)
    assert run_step(scheduler, fake_run, hooks)
    assert hooks.calls == ["before_run", "before_update", "after_update"]
    # before the update: counters not advanced, the finished request still holds its blocks
    assert hooks.computed_before_update == [0]
    assert hooks.held_before_update == [3]
    assert hooks.finished == ["a"]
    assert not scheduler.kv.block_ids("a") and scheduler.kv.check_integrity().in_use == 0


def test_steps_run_requests_to_their_end_as_the_bare_scheduler_does():
    bare, stepped = make_scheduler(tokens=8), make_scheduler(tokens=8)
    for s in (bare, stepped):
        for i, n in enumerate([13, 3, 9]):
            s.add_request(request(f"r{i}", n, max_tokens=5))
    expected = run_to_end(bare)

    class Collect(StepHooks):
        def __init__(self) -> None:
            self.outputs: dict[str, list[int]] = {}

        def after_update(self, out, result, finished) -> None:
            self.outputs |= {r.request_id: r.output_token_ids for r in finished}

    hooks = Collect()
    while stepped.has_unfinished_requests():
        run_step(stepped, fake_run, hooks)
    assert hooks.outputs == expected
