"""A node's copies between its KV tiers in simulated time (`SimTierTransport`): the
`TierTransport` the real `KVTiers` submits to, in place of the engine's `TierCopier`.

As on the copier's thread, copies run one at a time in the order submitted, whatever their
direction. Each takes `latency + num_blocks * block_bytes / bandwidth` of the profile's
figures for its tiers: device<->host over the host link, and a copy that reads or writes
the disk (host->disk, disk->device) at the disk's rate, the slower part of its way. A
finished copy is reported by `poll` and wakes the node at once (the real loop polls within
a millisecond while copies are in flight), whose next `schedule` applies it. A dead node's
copies never finish. Not modelled: a copy's own cost to the steps beside it (PCIe or memory
traffic, a CPU copier thread sharing the cores), and failed copies.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from tandem.engine.core.tier_ops import DISK, TierCopy
from tandem.sim.profiles import DeviceProfile

if TYPE_CHECKING:
    from tandem.sim.node import SimNode


def copy_seconds(profile: DeviceProfile, copy: TierCopy, block_bytes: int) -> float:
    """How long `copy` of blocks of `block_bytes` takes once it starts."""
    if DISK in (copy.src, copy.dst):
        latency, bandwidth = profile.disk_latency_s, profile.disk_bandwidth
    else:
        latency, bandwidth = profile.host_link_latency_s, profile.host_link_bandwidth
    return latency + copy.num_blocks * block_bytes / bandwidth


class SimTierTransport:
    """One node's copy queue on the cluster's clock; owns the copies until `poll` hands
    their ids back."""

    def __init__(self, node: SimNode, block_bytes: int) -> None:
        self.node = node
        self.block_bytes = block_bytes  # one block on this node's rank
        self.busy_s = 0.0  # seconds the queue spent copying
        self.num_copies = 0  # finished
        self._queue: deque[TierCopy] = deque()
        self._done: list[tuple[int, bool]] = []

    def submit(self, copy: TierCopy) -> None:
        """Queue `copy` behind every copy submitted before it; starts it if none runs."""
        self._queue.append(copy)
        if len(self._queue) == 1:
            self._start()

    def poll(self) -> list[tuple[int, bool]]:
        """(id, True) of the copies finished since the last poll."""
        done, self._done = self._done, []
        return done

    def _start(self) -> None:
        seconds = copy_seconds(self.node.cluster.profile, self._queue[0], self.block_bytes)
        self.busy_s += seconds
        self.node.cluster.events.after(seconds, self._finish)

    def _finish(self) -> None:
        if self.node.dead:
            return  # its process is gone, and the copies with it
        copy = self._queue.popleft()
        self._done.append((copy.copy_id, True))
        self.num_copies += 1
        if self._queue:
            self._start()
        self.node.poke()
