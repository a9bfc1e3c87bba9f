"""One lower tier's index (`TierIndex`): which block hash sits in which slot, in LRU order.

A lower tier is content-addressed by the same chained block hash as the device pool's
prefix cache, so a hash found here is a prefix hit. Slots are handed out free first; a full
tier makes room by evicting its least recently used hash (the caller demotes it a tier
down or drops it). Only bookkeeping: the data moves by `TierCopy`s that the owner of the
tensors runs in submission order, which is what keeps a reused slot safe.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from tandem.engine.core.block_hash import BlockHash


@dataclass(frozen=True)
class TierCounts:
    """A census of one tier: `used + free == total` always."""

    used: int
    free: int
    total: int


class TierIndex:
    """hash -> slot for one tier of `num_slots` blocks; LRU first in iteration order."""

    def __init__(self, name: str, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"the {name} tier needs at least one block, got {num_slots}")
        self.name = name
        self.num_slots = num_slots
        self._slots: OrderedDict[BlockHash, int] = OrderedDict()
        self._free = list(range(num_slots - 1, -1, -1))  # popped from the end: slot 0 first

    def __contains__(self, block_hash: BlockHash) -> bool:
        return block_hash in self._slots

    def __len__(self) -> int:
        return len(self._slots)

    def hashes(self) -> list[BlockHash]:
        return list(self._slots)

    def get(self, block_hash: BlockHash) -> int | None:
        return self._slots.get(block_hash)

    def touch(self, block_hash: BlockHash) -> None:
        """Mark `block_hash` most recently used."""
        self._slots.move_to_end(block_hash)

    def put(self, block_hash: BlockHash) -> tuple[int, tuple[BlockHash, int] | None]:
        """A slot for a new `block_hash` (which must not be here) and the (hash, slot) it
        evicted to make room, if any: that slot is the one returned."""
        if block_hash in self._slots:
            raise ValueError(f"block {block_hash:#x} is already in the {self.name} tier")
        evicted = None
        if self._free:
            slot = self._free.pop()
        else:
            evicted = self._slots.popitem(last=False)
            slot = evicted[1]
        self._slots[block_hash] = slot
        return slot, evicted

    def remove(self, block_hash: BlockHash) -> bool:
        """Forget `block_hash` (a copy of it failed); its slot is free again. False if it
        is not here."""
        slot = self._slots.pop(block_hash, None)
        if slot is None:
            return False
        self._free.append(slot)
        return True

    def counts(self) -> TierCounts:
        return TierCounts(len(self._slots), len(self._free), self.num_slots)

    def check_integrity(self) -> TierCounts:
        """Assert that every slot is either free or holds exactly one hash."""
        counts = self.counts()
        assert counts.used + counts.free == counts.total, counts
        slots = [*self._slots.values(), *self._free]
        assert sorted(slots) == list(range(self.num_slots)), "a slot lost or given twice"
        return counts
