"""Host cores shared by the nodes of one CPU host (`tandem serve` on one machine), as
processor sharing: while `n` nodes step and other work keeps `background` cores busy, every
step runs at `min(1, cores / (n + background))` of its speed alone. The rate is re-taken
whenever a step starts or ends, so a long prefill step slows down from the moment decode
steps join it and speeds up when they leave (a stretch fixed at a step's start, the former
model, missed both). With `cores` 0 every node has a device of its own: steps take their
time alone.

Other work on the host that follows the nodes' steps (the router and the clients relaying
each token a decode step produced) runs as tasks (`run`): each takes its share of the cores
as a step does until its work is done.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tandem.sim.events import EventQueue


@dataclass
class _Step:
    work_s: float  # left, in seconds alone
    done: Callable[..., None]
    args: tuple[Any, ...]


class SharedCores:
    """The steps in progress on the host and their common rate."""

    def __init__(self, events: EventQueue, cores: int, background: float = 0.0) -> None:
        self.events = events
        self.cores = cores
        self.background = background
        self._steps: dict[object, _Step] = {}  # by owner id, or ("task", n)
        self._num_tasks = 0
        self._since = 0.0  # when the work left was last brought up to date
        self._generation = 0  # end events of an older generation are stale

    @property
    def num_stepping(self) -> int:
        return len(self._steps)

    def rate(self) -> float:
        """Speed of each step now, against the step alone on a core."""
        if not self.cores or not self._steps:
            return 1.0
        return min(1.0, self.cores / (len(self._steps) + self.background))

    def start(self, owner: object, work_s: float, done: Callable[..., None], *args: Any) -> None:
        """`owner` starts a step of `work_s` seconds alone; `done(*args)` at its end."""
        if not self.cores:
            self.events.after(work_s, done, *args)
            return
        self._advance()
        self._steps[id(owner)] = _Step(work_s, done, args)
        self._reschedule()

    def run(self, work_s: float) -> None:
        """Work of `work_s` seconds alone that takes its share of the cores until done."""
        if not self.cores or work_s <= 0:
            return
        self._num_tasks += 1
        self._advance()
        self._steps[("task", self._num_tasks)] = _Step(work_s, _nothing, ())
        self._reschedule()

    def stop(self, owner: object) -> None:
        """`owner` died in the middle of its step: it no longer takes a share."""
        if id(owner) in self._steps:
            self._advance()
            del self._steps[id(owner)]
            self._reschedule()

    def _advance(self) -> None:
        now, rate = self.events.now, self.rate()
        for step in self._steps.values():
            step.work_s = max(0.0, step.work_s - (now - self._since) * rate)
        self._since = now

    def _reschedule(self) -> None:
        self._generation += 1
        rate = self.rate()
        for key, step in self._steps.items():
            self.events.after(step.work_s / rate, self._end, key, self._generation)

    def _end(self, key: object, generation: int) -> None:
        if generation != self._generation:
            return
        self._advance()
        step = self._steps.pop(key)
        self._reschedule()
        step.done(*step.args)


def _nothing() -> None:
    pass
