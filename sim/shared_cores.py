"""Host cores shared by the nodes of one CPU host (`tandem serve` on one machine), as
processor sharing: while `n` nodes step and other work keeps `background` cores busy, every
step runs at `min(1, cores / (n + background))` of its speed alone. The rate is re-taken
whenever a step starts or ends, so a long prefill step slows down from the moment decode
steps join it and speeds up when they leave (a stretch fixed at a step's start, the former
model, missed both). With `cores` 0 every node has a device of its own: steps take their
time alone.

Single-threaded processes on the host (the router, the clients: `sim/host_process.py`) take
one share while they work, as a node does while it steps. Work of two threads of one
Python process (a decode node's HTTP thread and its engine thread: `process`) takes one
share between them: a thread runs Python only while it holds the process's interpreter
lock, so the two take turns on one core whatever the host has free (the engine's model
work, which would run beside the lock, is a small part of a step on this model).

Steps on one host also slow each other down beyond their share of the cores: a prefill
step's matrix products evict a decode step's weights and KV from the shared caches and take
the memory bandwidth, so a decode step's own work grows by `interference` per prefill step
running beside it (measured from the nodes' step logs, `sim.interference.fit_interference`:
a decode step's runner CPU against the prefill steps overlapping it).
"""

from __future__ import annotations

from collections import Counter

from tandem.sim.host_cores import HostCores, Work


class SharedCores(HostCores):
    """The work in progress on the host and its common rate."""

    def rate(self) -> float:
        """Speed now of a step alone in its process, against the step alone on a core (a
        decode step's interference aside, `rate_of`): each process with work in progress
        takes one share."""
        if not self.cores or not self._work:
            return 1.0
        processes = len({work.process for work in self._work.values()})
        return min(1.0, self.cores / (processes + self.background))

    def rate_of(self, role: str) -> float:
        """Speed now of a step of `role` alone in its process: its share of the cores, less
        the interference of the prefill steps beside a decode step."""
        prefills = sum(1 for work in self._work.values() if work.role == "prefill")
        return self.slowed(self.rate(), role, prefills)

    def _speeds(self) -> dict[int, float]:
        """Each step's speed now: its role's, shared with the other steps of its process."""
        by_role = {role: self.rate_of(role) for role in ("", "prefill", "decode")}
        sharing = Counter(work.process for work in self._work.values())
        return {k: by_role[w.role] / sharing[w.process] for k, w in self._work.items()}

    def _added(self, key: int) -> None:
        pass  # it takes its share from now on

    def _removed(self, key: int, work: Work) -> None:
        pass  # its share goes to the rest

    def _reschedule(self) -> None:
        self._generation += 1
        speeds = self._speeds()
        for key, work in self._work.items():
            self.events.after(work.work_s / speeds[key], self._end, key, self._generation)

    def _end(self, key: int, generation: int) -> None:
        if generation != self._generation:
            return
        self._advance()
        work = self._work.pop(key)
        self._reschedule()
        work.done(*work.args)
