"""One engine step, the same for the offline engine (`LLMEngine`) and both nodes
(`PrefillNode`, `DecodeNode`): the scheduler plans, the runner executes the plan, the
scheduler applies the sampled tokens. What a caller adds goes in its `StepHooks`, called at
three fixed points of the step:

    schedule -> before_run -> execute -> before_update -> update -> after_update

- the offline engine: `after_update` checks stop strings and collects finished outputs;
- the prefill node: `before_run` counts queue time, `before_update` posts the KV writes
  the step made possible (before the update frees a finished request's blocks),
  `after_update` readies the finished jobs' `PrefillDone`;
- the decode node: `before_run` sends the step's remote prefills, `after_update` streams
  each new token.

The simulator's nodes (`sim/node.py`) run the real scheduler too but split a step over
simulated time; they call hooks of the same names at the same points.
"""

from __future__ import annotations

from collections.abc import Callable

from tandem.engine.core.request import Request
from tandem.engine.core.scheduler import ModelRunnerOutput, Scheduler, SchedulerOutput


class StepHooks:
    """What a caller adds to the step; each hook does nothing unless overridden. All run on
    the thread that steps."""

    def before_run(self, out: SchedulerOutput) -> None:
        """The step is planned (it may be empty) and nothing of it has run."""

    def before_update(self, out: SchedulerOutput, result: ModelRunnerOutput) -> None:
        """The batch ran (`result.kv_written` marks its KV writes); the requests' counters
        are not advanced yet and finished requests still hold their blocks."""

    def after_update(
        self, out: SchedulerOutput, result: ModelRunnerOutput, finished: list[Request]
    ) -> None:
        """Tokens appended; `finished` requests are done and their blocks freed."""


def run_step(
    scheduler: Scheduler,
    execute: Callable[[SchedulerOutput], ModelRunnerOutput],
    hooks: StepHooks,
) -> bool:
    """Schedule, execute and update once, calling `hooks` between. Returns whether a batch
    ran (False when the plan scheduled nothing: only `before_run` was called)."""
    out = scheduler.schedule()
    hooks.before_run(out)
    if out.is_empty:
        return False
    result = execute(out)
    hooks.before_update(out, result)
    finished = scheduler.update_from_output(out, result)
    hooks.after_update(out, result, finished)
    return True
