"""What the KV tiers ask of whoever owns the KV tensors: plain-data copies between the
device pool and the lower tiers, run in submission order (`TierTransport`).

Tiers, top down: `device` (the block pool the model reads), `host` (memory beside it:
pinned on a GPU, a second pool in its own memory on the CPU) and `disk` (a file under a
folder, for a local NVMe). A copy names its source and destination tier and one slot per
block on each side (a device slot is a block id). The scheduler side
(`tandem.engine.core.kv_tiers`) decides every slot; the owner of the tensors
(`tandem.engine.exec.tier_copier`) only copies. Copies run one after another in the order
submitted, so a copy never overtakes one it depends on: a block demoted from a host slot
leaves it before a later store overwrites the slot, and a load reads a slot after the store
that filled it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

DEVICE, HOST, DISK = "device", "host", "disk"
TIERS = (DEVICE, HOST, DISK)


@dataclass(frozen=True)
class TierCopy:
    """Copy block `src_slots[i]` of tier `src` into slot `dst_slots[i]` of tier `dst`."""

    copy_id: int
    src: str
    dst: str
    src_slots: tuple[int, ...]
    dst_slots: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.src == self.dst or {self.src, self.dst} - set(TIERS):
            raise ValueError(f"no copy from {self.src!r} to {self.dst!r}")
        if len(self.src_slots) != len(self.dst_slots):
            raise ValueError("a copy needs one destination slot per source slot")

    @property
    def num_blocks(self) -> int:
        return len(self.src_slots)


class TierTransport(Protocol):
    """Runs `TierCopy`s in submission order, off the thread that steps."""

    def submit(self, copy: TierCopy) -> None:
        """Queue `copy` after every copy submitted before it; returns at once."""

    def poll(self) -> list[tuple[int, bool]]:
        """(id, succeeded) of the copies finished since the last poll (never blocks). A
        failed copy wrote nothing usable; the copies after it still run."""
