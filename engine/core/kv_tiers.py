"""The KV tiers below the device pool (`KVTiers`): host memory, and optionally a local disk
under it, on the scheduler's side.

- **Down (write-through).** Every block the device pool publishes in its prefix cache is
  copied to the host tier after the step that computed it (unless the host already has its
  hash), under a reference that keeps the device block from being reused until the copy
  finished. So a block evicted from the device is already in the host tier: eviction stays
  what it was (drop the hash), and no step waits for a copy. A full host tier makes room
  by demoting its least recently used block to the disk tier (or dropping it, without one);
  a full disk tier drops its LRU block.
- **Up (load on a prefix hit).** A waiting request whose prefix continues in a lower tier
  after its device hits is not admitted yet: new device blocks are taken for the lower
  hits, the copies are queued, and the request steps aside (`Scheduler.loading`) while the
  others run. When its copies finished, the blocks are published in the device prefix cache
  and the request goes back to the head of the queue, where admission finds them as
  device hits. A load is tried once per request: under pressure that evicts what it
  loaded, the request computes instead of loading again.
- Every reference taken here is dropped when the copy that needed it finishes, whatever
  happened to the request meanwhile (an abort does not free blocks a copy still writes).

Copies go through a `TierTransport` in submission order (`tier_ops`), which is what makes a
reused host or disk slot safe without pins. Hits are counted by the scheduler; this class
counts blocks moved, the time each load took, and the stored/removed events of the lower
tiers (for routers).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tandem.engine.core.block_hash import BlockHash
from tandem.engine.core.block_pool import BlockPool, KVCacheBlock
from tandem.engine.core.tier_copy_plan import CopyPlan
from tandem.engine.core.tier_index import TierCounts, TierIndex
from tandem.engine.core.tier_ops import DEVICE, DISK, HOST, TierCopy, TierTransport

MAX_LOAD_SECONDS = 4096  # load times kept for a drain that does not come (offline engine)


@dataclass(frozen=True)
class TierHit:
    """A prompt block found in a lower tier."""

    block_hash: BlockHash
    tier: str
    slot: int


@dataclass
class TierChanges:
    """Hashes that entered or left each lower tier since the owner last drained them."""

    host_stored: list[BlockHash] = field(default_factory=list)
    host_removed: list[BlockHash] = field(default_factory=list)
    disk_stored: list[BlockHash] = field(default_factory=list)
    disk_removed: list[BlockHash] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.host_stored or self.host_removed or self.disk_stored or self.disk_removed)

    def add(self, tier: str, stored: bool, block_hash: BlockHash) -> None:
        getattr(self, f"{tier}_{'stored' if stored else 'removed'}").append(block_hash)


@dataclass
class _Load:
    request_id: str
    hashes: list[BlockHash]
    dest: list[KVCacheBlock]  # new device blocks the copies fill, in prompt order
    held: list[KVCacheBlock]  # the request's device hits, kept from eviction meanwhile
    pending: set[int]  # copy ids not finished yet
    started: float
    ok: bool = True  # every copy finished succeeded


class KVTiers:
    """Owns the lower tiers' indexes and the copies in flight; takes references on device
    blocks of `pool` only while a copy reads or writes them."""

    def __init__(
        self,
        pool: BlockPool,
        transport: TierTransport,
        host_blocks: int,
        disk_blocks: int = 0,
        block_bytes: int = 0,
        record_events: bool = False,
    ) -> None:
        """`record_events`: keep the hashes entering and leaving each tier in `events` for the
        owner to drain (KV events for routers); without it nothing accumulates."""
        self.pool = pool
        pool.keep_published = True
        self.transport = transport
        self.host = TierIndex(HOST, host_blocks)
        self.disk = TierIndex(DISK, disk_blocks) if disk_blocks else None
        self.block_bytes = block_bytes
        self.record_events = record_events
        self.events = TierChanges()
        # (tier, "down" | "up") -> blocks moved by finished copies; finished loads' seconds
        self.moved: Counter[tuple[str, str]] = Counter()
        # the latest finished loads' seconds, for the owner to drain (bounded without one)
        self.load_seconds: deque[float] = deque(maxlen=MAX_LOAD_SECONDS)
        self._next_id = 0
        self._stores: dict[int, list[KVCacheBlock]] = {}  # copy id -> device blocks read
        self._demotes: set[int] = set()
        self._loads: dict[str, _Load] = {}
        self._load_of: dict[int, str] = {}  # copy id -> its load's request id
        self._moves: dict[int, tuple[tuple[str, str], int]] = {}  # copy id -> (move, blocks)
        # copy id -> the (hash, slot) entries it fills in a lower tier
        self._writes: dict[int, list[tuple[BlockHash, int]]] = {}
        self.failed_copies = 0

    @property
    def tiers(self) -> tuple[TierIndex, ...]:
        return (self.host,) if self.disk is None else (self.host, self.disk)

    @property
    def in_flight(self) -> bool:
        """Copies queued or running."""
        return bool(self._stores or self._demotes or self._load_of)

    def lookup(self, hashes: Sequence[BlockHash]) -> list[TierHit]:
        """The leading run of `hashes` found in a lower tier (host first)."""
        hits = []
        for block_hash in hashes:
            hit = self._find(block_hash)
            if hit is None:
                break
            hits.append(hit)
        return hits

    def _find(self, block_hash: BlockHash) -> TierHit | None:
        for tier in self.tiers:
            slot = tier.get(block_hash)
            if slot is not None:
                return TierHit(block_hash, tier.name, slot)
        return None

    def store_published(self) -> None:
        """Queue the copy down of every block published since the last call whose hash the
        host tier lacks (the others only become its most recently used). The copies keep
        the order of the bookkeeping: a host slot's old block is demoted before a new one
        is stored in it, even within one call."""
        published, self.pool.published = self.pool.published, []
        ops = CopyPlan()
        for block, block_hash in published:
            if block.block_hash != block_hash:
                continue  # evicted since (its request ended before the step's update)
            if block_hash in self.host:
                self.host.touch(block_hash)
                continue
            slot, evicted = self.host.put(block_hash)
            self._record(HOST, True, block_hash)
            if evicted is not None:
                self._demote(*evicted, ops)
            ops.add(DEVICE, HOST, block.block_id, slot, block_hash, block)
        for op in ops.ops:
            self.pool.touch(op.blocks)
            copy_id = self._submit(op.src, op.dst, op.src_slots, op.dst_slots, op.entries)
            if op.src == DEVICE:
                self._stores[copy_id] = op.blocks
            else:
                self._demotes.add(copy_id)

    def _demote(self, block_hash: BlockHash, host_slot: int, ops: CopyPlan) -> None:
        """The host slot's block leaves the host tier: to the disk tier when there is one
        (and it lacks the hash), else dropped."""
        self._record(HOST, False, block_hash)
        if self.disk is None:
            return
        if block_hash in self.disk:
            self.disk.touch(block_hash)
            return
        slot, evicted = self.disk.put(block_hash)
        self._record(DISK, True, block_hash)
        if evicted is not None:
            self._record(DISK, False, evicted[0])
        ops.add(HOST, DISK, host_slot, slot, block_hash)

    def load(self, request_id: str, hits: Sequence[TierHit], held: Iterable[KVCacheBlock]) -> None:
        """Queue the copies of `hits` into fresh device blocks (owned here until they are
        published) and keep `held` (the request's device hits) from eviction until they
        finished. Raises ValueError, changing nothing, when the pool lacks the blocks."""
        if request_id in self._loads:
            raise ValueError(f"request {request_id!r} is already loading")
        held = list(held)
        self.pool.touch(held)
        try:
            dest = self.pool.get_new_blocks(len(hits))
        except ValueError:
            self.pool.free_blocks(reversed(held))
            raise
        load = _Load(request_id, [h.block_hash for h in hits], dest, held, set(), time.monotonic())
        for tier in self.tiers:
            pairs = [(h.slot, b.block_id) for h, b in zip(hits, dest) if h.tier == tier.name]
            for hit in hits:
                if hit.tier == tier.name:
                    tier.touch(hit.block_hash)
            if pairs:
                copy_id = self._submit(tier.name, DEVICE, *zip(*pairs))
                load.pending.add(copy_id)
                self._load_of[copy_id] = request_id
        self._loads[request_id] = load

    def poll(self) -> list[str]:
        """Apply the copies finished since the last poll: drop the references they needed,
        publish loaded blocks (a failed copy: forget what it wrote instead). Returns the
        request ids whose load ended."""
        done = []
        for copy_id, ok in self.transport.poll():
            move, num_blocks = self._moves.pop(copy_id)
            written = self._writes.pop(copy_id)
            if ok:
                self.moved[move] += num_blocks
            else:
                self.failed_copies += 1
                self._forget(written)
            if copy_id in self._demotes:
                self._demotes.remove(copy_id)
            elif copy_id in self._stores:
                self.pool.free_blocks(reversed(self._stores.pop(copy_id)))  # tail first
            else:
                request_id = self._load_of.pop(copy_id)
                load = self._loads[request_id]
                load.pending.remove(copy_id)
                load.ok = load.ok and ok
                if not load.pending:
                    self._finish_load(self._loads.pop(request_id))
                    done.append(request_id)
        return done

    def _forget(self, entries: list[tuple[BlockHash, int]]) -> None:
        """A copy into a lower tier failed: the hashes it carried hold garbage there, and in
        any tier a later copy moved that slot to (a demotion queued behind it), so they are
        forgotten in every lower tier, and a load still in flight that reads one of them
        publishes nothing. Forgetting a good copy only costs a future hit."""
        hashes = {block_hash for block_hash, _ in entries}
        for index in self.tiers:
            for block_hash in hashes:
                if index.remove(block_hash):
                    self._record(index.name, False, block_hash)
        for load in self._loads.values():
            if hashes.intersection(load.hashes):
                load.ok = False

    def _finish_load(self, load: _Load) -> None:
        if load.ok:
            self.pool.cache_full_blocks(load.dest, load.hashes, 0)
        self.pool.free_blocks(reversed([*load.held, *load.dest]))
        self.load_seconds.append(time.monotonic() - load.started)

    def drain_load_seconds(self) -> list[float]:
        """The seconds of the loads finished since the last drain; starts anew."""
        seconds = list(self.load_seconds)
        self.load_seconds.clear()
        return seconds

    def _submit(
        self,
        src: str,
        dst: str,
        src_slots: Sequence[int],
        dst_slots: Sequence[int],
        entries: list[tuple[BlockHash, int]] | None = None,
    ) -> int:
        """Queue one copy; `entries`: the (hash, slot) pairs it fills in a lower tier."""
        copy_id = self._next_id
        self._next_id += 1
        self.transport.submit(TierCopy(copy_id, src, dst, tuple(src_slots), tuple(dst_slots)))
        move = (src, "up") if dst == DEVICE else (dst, "down")
        self._moves[copy_id] = (move, len(src_slots))
        self._writes[copy_id] = entries or []
        return copy_id

    def _record(self, tier: str, stored: bool, block_hash: BlockHash) -> None:
        if self.record_events:
            self.events.add(tier, stored, block_hash)

    def drain_events(self) -> TierChanges:
        """The changes since the last drain (for the node's KV events); starts anew."""
        events, self.events = self.events, TierChanges()
        return events

    def held_blocks(self) -> list[KVCacheBlock]:
        """Every device block reference this class holds (one entry per reference)."""
        blocks = [b for held in self._stores.values() for b in held]
        for load in self._loads.values():
            blocks.extend(load.held)
            blocks.extend(load.dest)
        return blocks

    def counts(self) -> dict[str, TierCounts]:
        return {tier.name: tier.counts() for tier in self.tiers}

    def check_integrity(self) -> dict[str, TierCounts]:
        """Each lower tier's census, its invariants asserted."""
        return {tier.name: tier.check_integrity() for tier in self.tiers}
