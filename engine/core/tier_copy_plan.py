"""The copies one call of `KVTiers.store_published` queues, in the order they must run
(`CopyPlan`): a block joins the last copy when it goes between the same tiers and writes no
slot that copy writes, since one copy gathers all its sources before it scatters."""

from __future__ import annotations

from dataclasses import dataclass, field

from tandem.engine.core.block_hash import BlockHash
from tandem.engine.core.block_pool import KVCacheBlock


@dataclass
class CopyOp:
    src: str
    dst: str
    src_slots: list[int] = field(default_factory=list)
    dst_slots: list[int] = field(default_factory=list)
    entries: list[tuple[BlockHash, int]] = field(default_factory=list)  # (hash, dst slot)
    blocks: list[KVCacheBlock] = field(default_factory=list)  # device blocks it reads
    written: set[int] = field(default_factory=set)  # dst_slots as a set (membership checks)


class CopyPlan:
    """Copies in the order they must run; a block joins the last copy when it has the same
    tiers and does not write a slot that copy writes (one copy gathers, then scatters)."""

    def __init__(self) -> None:
        self.ops: list[CopyOp] = []

    def add(
        self,
        src: str,
        dst: str,
        src_slot: int,
        dst_slot: int,
        block_hash: BlockHash,
        block: KVCacheBlock | None = None,
    ) -> None:
        last = self.ops[-1] if self.ops else None
        if last is None or (last.src, last.dst) != (src, dst) or dst_slot in last.written:
            last = CopyOp(src, dst)
            self.ops.append(last)
        last.src_slots.append(src_slot)
        last.dst_slots.append(dst_slot)
        last.written.add(dst_slot)
        last.entries.append((block_hash, dst_slot))
        if block is not None:
            last.blocks.append(block)
