"""A single-threaded process on a CPU host (the router's event loop, a client): its work
runs one item at a time, in the order it came, each item taking its share of the host's
cores as a node's step does (`SharedCores`); what follows an item (a request forwarded, a
token handed on) happens when the item is done.

Work the router does for a burst of requests that arrive together is serial in the real
router: the last of them is forwarded only after the others, and a token it relays
meanwhile waits its turn. As tasks of their own on the cores (the former model) the same
work ran side by side, all of it done at once at a fraction of the speed.

On a host whose cores are not simulated (`SharedCores.cores` 0: every node has devices
of its own, the router its own CPU) an item's work costs nothing and follows at once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from tandem.sim.events import EventQueue
from tandem.sim.host_cores import HostCores
from tandem.sim.profiles import DeviceProfile
from tandem.sim.shared_cores import SharedCores
from tandem.sim.sliced_cores import SlicedCores


def host_cores(events: EventQueue, profile: DeviceProfile) -> HostCores:
    """The host's cores as `profile` has them: in time slices where it gives the slice,
    else shared evenly."""
    args = (events, profile.host_cores, profile.host_background_load, profile.host_interference)
    if profile.host_time_slice_s:
        return SlicedCores(*args, slice_s=profile.host_time_slice_s)
    return SharedCores(*args)


class HostProcess:
    """Owns its queue of work items; at most one of them is on the cores."""

    def __init__(self, cores: HostCores, process: object = None) -> None:
        """`process`: the OS process whose interpreter lock it shares with other work (a
        decode node's HTTP thread: the node's engine steps); None: a process of its own."""
        self.cores = cores
        self.process = process
        self._queue: deque[tuple[float, Callable[..., None], tuple[Any, ...]]] = deque()
        self._busy = False
        self.busy_s = 0.0  # CPU seconds of work done (alone on a core)

    def submit(self, work_s: float, done: Callable[..., None], *args: Any) -> None:
        """`done(*args)` once this process has done `work_s` seconds of CPU work for it,
        after the items submitted before it."""
        if not self.cores.cores or (work_s <= 0 and not self._busy):
            done(*args)
            return
        self._queue.append((work_s, done, args))
        if not self._busy:
            self._next()

    @property
    def queued(self) -> int:
        """Items waiting or running."""
        return len(self._queue) + self._busy

    def _next(self) -> None:
        work_s, done, args = self._queue.popleft()
        self._busy = True
        self.busy_s += work_s
        self.cores.start(self, work_s, self._finish, done, args, process=self.process)

    def _finish(self, done: Callable[..., None], args: tuple[Any, ...]) -> None:
        self._busy = False
        if self._queue:
            self._next()
        done(*args)
