"""The block pool: every KV block of a node, its reference counts, and the prefix cache.

Blocks with no reference sit in one free queue in eviction order (least recently freed
first). A free block that still holds a hash is a cached block: a request with the same
prefix can take it back with `touch`; it is evicted (hash dropped) only when a new block
is needed and it reaches the head of the queue.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tandem.engine.core.block_hash import BlockHash


class KVCacheBlock:
    """One block's bookkeeping; the data lives in the node's KV-cache tensor."""

    __slots__ = ("block_hash", "block_id", "next_free", "prev_free", "ref_cnt")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: BlockHash | None = None
        self.prev_free: KVCacheBlock | None = None
        self.next_free: KVCacheBlock | None = None

    def __repr__(self) -> str:
        return f"KVCacheBlock(id={self.block_id}, ref={self.ref_cnt}, hash={self.block_hash})"


class FreeBlockQueue:
    """Doubly linked list of free blocks: O(1) pop from the head, append, and removal from the
    middle (when a cached block is touched again)."""

    def __init__(self, blocks: Sequence[KVCacheBlock]) -> None:
        self._head = KVCacheBlock(-1)
        self._tail = KVCacheBlock(-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self.num_free_blocks = 0
        for block in blocks:
            self.append(block)

    def popleft(self) -> KVCacheBlock:
        block = self._head.next_free
        if block is self._tail or block is None:
            raise ValueError("no free block to pop")
        self.remove(block)
        return block

    def remove(self, block: KVCacheBlock) -> None:
        assert block.prev_free is not None and block.next_free is not None, block
        block.prev_free.next_free = block.next_free
        block.next_free.prev_free = block.prev_free
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        last = self._tail.prev_free
        assert last is not None
        last.next_free = block
        block.prev_free = last
        block.next_free = self._tail
        self._tail.prev_free = block
        self.num_free_blocks += 1

    def __iter__(self):
        block = self._head.next_free
        while block is not self._tail and block is not None:
            yield block
            block = block.next_free


@dataclass(frozen=True)
class BlockCounts:
    """A census of the pool: `free + cached + in_use == total` always."""

    free: int
    cached: int
    in_use: int
    total: int


class BlockPool:
    """Owns every `KVCacheBlock`; hands them out with a reference count of one."""

    def __init__(
        self, num_blocks: int, enable_caching: bool = True, record_events: bool = False
    ) -> None:
        """`record_events`: append (stored?, hash) to `events` whenever a hash enters or
        leaves the prefix cache; the owner drains the list (KV events for routers)."""
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be at least 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.cached: dict[BlockHash, KVCacheBlock] = {}
        self.num_evictions = 0
        self.record_events = record_events
        self.events: list[tuple[bool, BlockHash]] = []
        # With KV tiers (`tandem.engine.core.kv_tiers`): (block, hash) of every block
        # published in the prefix cache since the tiers last drained this list.
        self.keep_published = False
        self.published: list[tuple[KVCacheBlock, BlockHash]] = []

    @property
    def num_free_blocks(self) -> int:
        """Blocks obtainable now: never-used, freed and evictable cached ones."""
        return self.free_queue.num_free_blocks

    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        return self.cached.get(block_hash) if self.enable_caching else None

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop `num_blocks` from the head of the free queue, evicting cached ones.

        Raises ValueError (and changes nothing) when fewer are free.
        """
        if num_blocks > self.num_free_blocks:
            raise ValueError(f"asked for {num_blocks} blocks, {self.num_free_blocks} free")
        blocks = [self.free_queue.popleft() for _ in range(num_blocks)]
        for block in blocks:
            self._evict(block)
            block.ref_cnt = 1
        return blocks

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take one more reference on each block, pulling cached ones off the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference from each block; those reaching zero join the free queue's tail
        in the given order (pass a request's blocks tail first, so its prefix is evicted
        last)."""
        for block in ordered_blocks:
            assert block.ref_cnt > 0, f"double free of {block}"
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_queue.append(block)

    def cache_full_blocks(
        self, blocks: Sequence[KVCacheBlock], block_hashes: Sequence[BlockHash], start: int
    ) -> None:
        """Publish `blocks[start:len(block_hashes)]` in the prefix cache under their hashes.

        A hash already cached by another block keeps the older block; the newer one stays
        private to its request.
        """
        if not self.enable_caching:
            return
        for block, block_hash in zip(blocks[start : len(block_hashes)], block_hashes[start:]):
            if block.block_hash is not None or block_hash in self.cached:
                continue
            block.block_hash = block_hash
            self.cached[block_hash] = block
            if self.keep_published:
                self.published.append((block, block_hash))
            if self.record_events:
                self.events.append((True, block_hash))

    def _evict(self, block: KVCacheBlock) -> None:
        if block.block_hash is None:
            return
        if self.cached.get(block.block_hash) is block:
            del self.cached[block.block_hash]
            if self.record_events:
                self.events.append((False, block.block_hash))
        block.block_hash = None
        self.num_evictions += 1

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; refused (False) while any block is in use."""
        if self.num_free_blocks != self.num_blocks:
            return False
        for block in self.blocks:
            block.block_hash = None
        if self.record_events:
            self.events.extend((False, block_hash) for block_hash in self.cached)
        self.cached.clear()
        return True

    def counts(self) -> BlockCounts:
        free = cached = in_use = 0
        for block in self.blocks:
            if block.ref_cnt > 0:
                in_use += 1
            elif block.block_hash is None:
                free += 1
            else:
                cached += 1
        return BlockCounts(free=free, cached=cached, in_use=in_use, total=self.num_blocks)

    def check_integrity(self) -> BlockCounts:
        """Assert every invariant of the pool and return its census.

        free + cached + in_use == total; the free queue holds exactly the unreferenced
        blocks, each once; every cached hash maps to a block carrying that hash.
        Raises AssertionError on the first violation.
        """
        counts = self.counts()
        assert counts.free + counts.cached + counts.in_use == counts.total, counts
        queued = list(self.free_queue)
        assert len(queued) == self.num_free_blocks, (len(queued), self.num_free_blocks)
        assert len({b.block_id for b in queued}) == len(queued), "block queued twice"
        assert all(b.ref_cnt == 0 for b in queued), "referenced block in the free queue"
        assert len(queued) == counts.free + counts.cached, (len(queued), counts)
        for block_hash, block in self.cached.items():
            assert block.block_hash == block_hash, (block_hash, block)
        hashed = sum(1 for b in self.blocks if b.block_hash is not None)
        assert hashed == len(self.cached), (hashed, len(self.cached))
        return counts
