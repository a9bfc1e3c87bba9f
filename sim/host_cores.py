"""A CPU host's cores as the simulated deployment's processes use them: the work in
progress, keyed by its owner (a node stepping, a host process's item), and what every way
of sharing the cores has in common. Evenly (processor sharing, `sim/shared_cores.py`) or
in time slices (`sim/sliced_cores.py`). With `cores` 0 nothing is shared: every node has
devices of its own and work takes its time alone.

Other tenants' busy cores (`background`) take their share too; a decode step's own work
runs slower by `interference` for each prefill step beside it (shared caches, memory
bandwidth; `sim/interference.py`); the work of one OS process's threads (`process`: a
decode node's HTTP thread and its engine thread) holds one interpreter lock.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tandem.sim.events import EventQueue


@dataclass
class Work:
    """A piece of work in progress."""

    work_s: float  # left, in seconds alone on a core
    done: Callable[..., None]
    args: tuple[Any, ...]
    role: str  # "prefill", "decode" (a node's step), or "" for a host process's work
    process: int  # id of the OS process whose interpreter lock it holds to run
    slice_s: float | None  # how long it runs before it yields its core by itself


class HostCores(ABC):
    """Owns the work in progress; a subclass says how fast each piece runs and when."""

    def __init__(
        self, events: EventQueue, cores: int, background: float = 0.0, interference: float = 0.0
    ) -> None:
        self.events = events
        self.cores = cores
        self.background = background
        self.interference = interference
        self._work: dict[int, Work] = {}  # by owner id
        self._since = 0.0  # when the work left was last brought up to date
        self._generation = 0  # end events of an older generation are stale

    @property
    def num_stepping(self) -> int:
        return len(self._work)

    def start(
        self,
        owner: object,
        work_s: float,
        done: Callable[..., None],
        *args: Any,
        role: str = "",
        process: object = None,
        slice_s: float | None = None,
    ) -> None:
        """`owner` starts `work_s` seconds of work (alone on a core); `done(*args)` at its
        end. `process`: the OS process it runs in, when other owners' work runs in it too;
        by default a process of its own. `slice_s`: how long it runs before it yields its
        core by itself (in time slices; shared evenly, work has no slices)."""
        if not self.cores:
            self.events.after(work_s, done, *args)
            return
        self._advance()
        key = id(owner)
        self._work[key] = Work(work_s, done, args, role, id(process or owner), slice_s)
        self._added(key)
        self._reschedule()

    def stop(self, owner: object) -> None:
        """`owner` died in the middle of its work: it no longer takes a share."""
        key = id(owner)
        if key in self._work:
            self._advance()
            self._removed(key, self._work.pop(key))
            self._reschedule()

    def slowed(self, share: float, role: str, prefills: int) -> float:
        """A piece's speed from its share of the cores: a decode step's is less the
        interference of `prefills` prefill steps beside it."""
        if role != "decode" or not self.interference:
            return share
        return share / (1.0 + self.interference * prefills)

    def _advance(self) -> None:
        """Bring the work left up to date at the speeds since the last change."""
        now, speeds = self.events.now, self._speeds()
        for key, speed in speeds.items():
            work = self._work[key]
            work.work_s = max(0.0, work.work_s - (now - self._since) * speed)
        self._since = now

    @abstractmethod
    def _speeds(self) -> dict[int, float]:
        """The speed of each piece of work that runs now, by key."""

    @abstractmethod
    def _added(self, key: int) -> None:
        """Work `key` has just started."""

    @abstractmethod
    def _removed(self, key: int, work: Work) -> None:
        """Work `key` has stopped before its end."""

    @abstractmethod
    def _reschedule(self) -> None:
        """After a change: the next events, each of a new generation."""
