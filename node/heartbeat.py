"""When a node's engine thread last turned its loop, read by the HTTP handlers to tell a
stuck engine from a busy one (`/health`, `/health/live`; docs/security.md "Liveness")."""

from __future__ import annotations

import time
from collections.abc import Callable

# Seconds without a loop turn before the engine counts as stalled. A turn is one engine
# step plus at most one idle poll (100 ms), and the longest legitimate step is a long
# prefill on the CPU: a full 2,048-token batch of a 1B model takes a few seconds on one
# thread, so 30 s leaves a wide margin and still ends a hung node within a minute.
STALL_AFTER_S = 30.0


class Heartbeat:
    """The monotonic time of the engine loop's last turn. `beat` is called by the engine
    thread only; the readers on the event loop see a float that is replaced whole."""

    def __init__(
        self, stall_after_s: float = STALL_AFTER_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if stall_after_s <= 0:
            raise ValueError("stall_after_s must be positive")
        self.stall_after_s = stall_after_s
        self.clock = clock
        self.last: float | None = None  # None until the engine's first turn (still loading)

    def beat(self) -> None:
        self.last = self.clock()

    def stalled_s(self) -> float | None:
        """Seconds since the last turn when more than the bound, else None (also before
        the first turn: a loading model is not a stalled one)."""
        if self.last is None:
            return None
        age = self.clock() - self.last
        return age if age > self.stall_after_s else None
