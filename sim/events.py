"""The simulated clock: a heap of (time, sequence, callback). Nothing sleeps; `run` jumps
from one event to the next."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any


class EventQueue:
    """Owns the clock. Events at the same time run in the order they were scheduled, so a
    run is deterministic (and messages on one link arrive in the order they were sent)."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = 0
        self.num_events = 0
        self.stopped = False

    def at(self, time: float, callback: Callable[..., None], *args: Any) -> None:
        """Run `callback(*args)` at simulated `time` (never before now)."""
        if time < self.now:
            raise ValueError(f"event at {time} is in the past (now {self.now})")
        self._seq += 1
        heapq.heappush(self._heap, (time, self._seq, callback, args))

    def after(self, delay: float, callback: Callable[..., None], *args: Any) -> None:
        self.at(self.now + delay, callback, *args)

    def stop(self) -> None:
        """End `run` after the current event; what is left is never run."""
        self.stopped = True

    def run(self, until: float = float("inf")) -> None:
        """Process events in time order until none is left, the next is after `until`, or
        `stop` was called."""
        heap = self._heap
        while heap and heap[0][0] <= until and not self.stopped:
            time, _, callback, args = heapq.heappop(heap)
            self.now = time
            self.num_events += 1
            callback(*args)
