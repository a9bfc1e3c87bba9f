"""Host cores shared in time slices, as the kernel shares them: at most `cores` pieces of
work run at once, each at full speed, for a slice at a time; when its slice ends and other
work waits for a core it goes to the back of the queue. Work that starts takes a free core
or joins the queue. A piece's slice is the kernel's (`slice_s`, how long a thread that
never waits keeps a core) or shorter where its thread leaves the core sooner by itself: a
node's engine thread waits for the interpreter lock whenever its HTTP thread takes it to
stream records, so it runs in short stretches (measured from the nodes' step logs,
`execute_switches`) and after each it waits behind the work queued meanwhile.

Processor sharing (`sim/shared_cores.py`) runs every piece at `cores / n` of its speed,
all the time: a decode step of 4 ms beside three others on two cores always takes 8 ms.
On the real host (docs/performance.md, 2026-11-26) the same steps took 4.5 ms at the 10th
percentile and 15-17 ms at the 90th: a step either finds a core or waits out other
work's slices, and a step that waits for the second slice of a long prefill step waits
all of it. The median agrees in both models; the spread, the tails of time per output
token, is what time slices add.

The rest is as in `SharedCores` (`sim/host_cores.py`): other tenants' busy cores
(`background`) slow the work on a core as they take their share, a decode step runs slower
by `interference` for each prefill step on a core beside it, and the pieces of one OS
process (`process`: a decode node's HTTP thread and engine thread) hold one interpreter
lock, so at most one of them is on a core; they take turns by slices too.
"""

from __future__ import annotations

from collections import deque

from tandem.sim.events import EventQueue
from tandem.sim.host_cores import HostCores, Work

_DONE_S = 1e-12  # work left below this is done (float rounding of work / speed)


class SlicedCores(HostCores):
    """The work on the host: what is on a core (since when its slice began) and what
    waits, in order."""

    def __init__(
        self,
        events: EventQueue,
        cores: int,
        background: float = 0.0,
        interference: float = 0.0,
        slice_s: float = 0.003,
    ) -> None:
        if slice_s <= 0:
            raise ValueError("a time slice must be positive")
        super().__init__(events, cores, background, interference)
        self.slice_s = slice_s  # the kernel's
        self._waiting: deque[int] = deque()
        self._on_core: dict[int, float] = {}  # owner id -> when its slice began

    def speed(self, key: int) -> float:
        """How fast the work on a core at `key` runs now, against alone on the host."""
        share = min(1.0, self.cores / (len(self._on_core) + self.background))
        prefills = sum(1 for k in self._on_core if self._work[k].role == "prefill")
        return self.slowed(share, self._work[key].role, prefills)

    def _slice(self, key: int) -> float:
        own = self._work[key].slice_s
        return min(own, self.slice_s) if own else self.slice_s

    def _speeds(self) -> dict[int, float]:
        return {key: self.speed(key) for key in self._on_core}

    def _added(self, key: int) -> None:
        self._waiting.append(key)
        self._dispatch()

    def _removed(self, key: int, work: Work) -> None:
        if self._on_core.pop(key, None) is None:
            self._waiting.remove(key)
        self._dispatch()

    def _runnable(self, leaving: int | None = None) -> list[int]:
        """The waiting work that a core would take, in queue order (at most one piece of
        a process on the cores), were `leaving` off its core."""
        busy = {self._work[k].process for k in self._on_core if k != leaving}
        out = []
        for key in self._waiting:
            process = self._work[key].process
            if process not in busy:
                out.append(key)
                busy.add(process)
        return out

    def _dispatch(self) -> None:
        free = self.cores - len(self._on_core)
        for key in self._runnable()[: max(0, free)]:
            self._waiting.remove(key)
            self._on_core[key] = self.events.now

    def _reschedule(self) -> None:
        self._generation += 1
        now = self.events.now
        for key, began in self._on_core.items():
            to_finish = self._work[key].work_s / self.speed(key)
            to_slice_end = max(0.0, began + self._slice(key) - now)
            self.events.after(min(to_finish, to_slice_end), self._tick, key, self._generation)

    def _tick(self, key: int, generation: int) -> None:
        """The work at `key` is done, or its slice is over."""
        if generation != self._generation:
            return
        self._advance()
        work = self._work[key]
        if work.work_s <= _DONE_S:
            del self._work[key], self._on_core[key]
            self._dispatch()
            self._reschedule()
            work.done(*work.args)
            return
        if self._runnable(leaving=key):  # someone waits for this core: to the back
            del self._on_core[key]
            self._waiting.append(key)
            self._dispatch()
        else:
            self._on_core[key] = self.events.now  # a new slice
        self._reschedule()
