"""Maps requests to blocks: prefix-cache lookups and all-or-nothing slot allocation."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from tandem.engine.core.block_hash import block_extra_keys, hash_blocks
from tandem.engine.core.block_pool import BlockCounts, BlockPool, KVCacheBlock
from tandem.engine.core.kv_tiers import KVTiers, TierHit
from tandem.engine.core.request import Request
from tandem.engine.core.tier_ops import TierTransport


@dataclass(frozen=True)
class ComputedBlocks:
    """A prefix-cache hit: blocks whose KV is already computed, and how many tokens they
    hold; `lower`: the blocks that continue the prefix in a lower KV tier (to load first)."""

    blocks: tuple[KVCacheBlock, ...] = ()
    num_tokens: int = 0
    lower: tuple[TierHit, ...] = ()


@dataclass
class PrefixCacheStats:
    """Counted in tokens, like vLLM: queried prompt tokens and those found cached."""

    queries: int = 0
    hits: int = 0  # in every tier
    tier_hits: Counter[str] = field(default_factory=Counter)  # "device" | "host" | "disk"


@dataclass
class KVCacheManager:
    """Owns each request's block list.

    `get_computed_blocks` is a pure lookup; `allocate_slots` either reserves everything a
    step needs or returns None having changed nothing; `free` releases a request's blocks
    (tail first, so its shared prefix is evicted last).
    """

    block_size: int
    num_blocks: int
    enable_caching: bool = True
    revision: str = ""  # the model revision label: part of every block hash
    record_events: bool = False
    pool: BlockPool = field(init=False)
    stats: PrefixCacheStats = field(default_factory=PrefixCacheStats)
    _req_blocks: dict[str, list[KVCacheBlock]] = field(default_factory=dict)
    _req_block_ids: dict[str, list[int]] = field(default_factory=dict)
    _num_cached_blocks: dict[str, int] = field(default_factory=dict)
    # Extra references owned by something other than a request: blocks a NIXL transfer may
    # still read or write, keyed by whoever releases them.
    _holds: dict[str, list[KVCacheBlock]] = field(default_factory=dict)
    # The host (and disk) tiers under the pool, once the runner's copier exists.
    tiers: KVTiers | None = None

    def __post_init__(self) -> None:
        self.pool = BlockPool(self.num_blocks, self.enable_caching, self.record_events)

    def usage(self) -> float:
        return self.pool.usage()

    def attach_tiers(
        self, transport: TierTransport, host_blocks: int, disk_blocks: int = 0, block_bytes: int = 0
    ) -> KVTiers:
        """Put lower KV tiers under the pool, their copies run by `transport` (the runner's
        `TierCopier`); before the first request."""
        self.tiers = KVTiers(
            self.pool, transport, host_blocks, disk_blocks, block_bytes, self.record_events
        )
        return self.tiers

    def block_ids(self, request_id: str) -> list[int]:
        """The request's block table (live list, owned by the manager: do not mutate)."""
        return self._req_block_ids.get(request_id, [])

    def num_blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_ready_blocks(self, num_prompt_tokens: int, num_computed_tokens: int) -> int:
        """Prompt blocks whose KV is complete once `num_computed_tokens` are computed: the
        full ones, and the last partial one when the whole prompt is done."""
        if num_computed_tokens >= num_prompt_tokens:
            return self.num_blocks_needed(num_prompt_tokens)
        return num_computed_tokens // self.block_size

    def get_computed_blocks(self, request: Request, lower: bool = True) -> ComputedBlocks:
        """Longest cached prefix of the request's full blocks, leaving at least one token to
        compute (the model must run to produce logits): device hits, then (with tiers, and
        `lower`) the run that continues in a lower tier. No side effect: the scheduler
        counts the prefix-cache stats once, when it admits the request."""
        if not self.enable_caching:
            return ComputedBlocks()
        self._update_hashes(request)
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        hits: list[KVCacheBlock] = []
        for block_hash in request.block_hashes[:max_hit_blocks]:
            block = self.pool.get_cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        below: tuple[TierHit, ...] = ()
        if lower and self.tiers is not None:
            below = tuple(self.tiers.lookup(request.block_hashes[len(hits) : max_hit_blocks]))
        return ComputedBlocks(tuple(hits), len(hits) * self.block_size, below)

    def can_allocate(
        self, request: Request, num_new_tokens: int, computed: ComputedBlocks = ComputedBlocks()
    ) -> bool:
        return self._num_new_blocks(request, num_new_tokens, computed) is not None

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        computed: ComputedBlocks = ComputedBlocks(),
        publish: bool = True,
    ) -> list[KVCacheBlock] | None:
        """Reserve blocks so `request` can compute `num_new_tokens` more tokens after its
        computed ones (plus `computed`, a fresh prefix hit to adopt).

        Returns the newly allocated blocks, or None, with no side effect, when the pool cannot
        hold them. Full blocks are published in the prefix cache as soon as they are
        reserved (within one step the KV write precedes attention in every layer), unless
        `publish` is False: blocks another node fills are published by `cache_blocks` once
        their KV has landed.
        """
        num_new = self._num_new_blocks(request, num_new_tokens, computed)
        if num_new is None:
            return None
        blocks = self._req_blocks.setdefault(request.request_id, [])
        block_ids = self._req_block_ids.setdefault(request.request_id, [])
        self.pool.touch(computed.blocks)
        new_blocks = self.pool.get_new_blocks(num_new)
        for block in (*computed.blocks, *new_blocks):
            blocks.append(block)
            block_ids.append(block.block_id)
        if publish:
            num_tokens = request.num_computed_tokens + computed.num_tokens + num_new_tokens
            self.cache_blocks(request, num_tokens)
        return new_blocks

    def free(self, request: Request) -> None:
        """Release every block of `request`; cached ones stay reusable until evicted."""
        blocks = self._req_blocks.pop(request.request_id, [])
        self._req_block_ids.pop(request.request_id, None)
        self._num_cached_blocks.pop(request.request_id, None)
        self.pool.free_blocks(reversed(blocks))

    def hold(self, key: str, request_id: str, start: int = 0, end: int | None = None) -> None:
        """Take an extra reference, under `key`, on the request's blocks `start:end`: they
        outlive the request until `release(key)`."""
        if key in self._holds:
            raise ValueError(f"hold {key!r} already exists")
        blocks = self._req_blocks.get(request_id, [])[start:end]
        self.pool.touch(blocks)
        self._holds[key] = blocks

    def release(self, key: str) -> bool:
        """Drop the hold `key`; False if there is none."""
        blocks = self._holds.pop(key, None)
        if blocks is None:
            return False
        self.pool.free_blocks(reversed(blocks))
        return True

    def is_held(self, key: str) -> bool:
        return key in self._holds

    def num_blocks_held(self, key: str) -> int:
        """Blocks under the hold `key` (0 if there is none)."""
        return len(self._holds.get(key, ()))

    def hold_keys(self) -> list[str]:
        return list(self._holds)

    @property
    def num_held_blocks(self) -> int:
        return sum(len(blocks) for blocks in self._holds.values())

    def check_integrity(self) -> BlockCounts:
        """Pool invariants, plus: each block's reference count equals the number of request
        block lists and holds that contain it."""
        counts = self.pool.check_integrity()
        refs = [0] * self.num_blocks
        for request_id, blocks in self._req_blocks.items():
            assert self._req_block_ids[request_id] == [b.block_id for b in blocks], request_id
            for block in blocks:
                refs[block.block_id] += 1
        for blocks in self._holds.values():
            for block in blocks:
                refs[block.block_id] += 1
        if self.tiers is not None:
            for block in self.tiers.held_blocks():
                refs[block.block_id] += 1
            self.tiers.check_integrity()
        for block in self.pool.blocks:
            assert block.ref_cnt == refs[block.block_id], (block, refs[block.block_id])
        return counts

    def _num_new_blocks(
        self, request: Request, num_new_tokens: int, computed: ComputedBlocks
    ) -> int | None:
        held = len(self._req_blocks.get(request.request_id, ()))
        total_tokens = request.num_computed_tokens + computed.num_tokens + num_new_tokens
        num_new = self.num_blocks_needed(total_tokens) - held - len(computed.blocks)
        num_new = max(num_new, 0)
        # Cached blocks we are about to touch leave the free queue too.
        num_reclaimed = sum(1 for b in computed.blocks if b.ref_cnt == 0)
        if num_new + num_reclaimed > self.pool.num_free_blocks:
            return None
        return num_new

    def _update_hashes(self, request: Request) -> None:
        hashes = request.block_hashes
        if len(hashes) >= request.num_tokens // self.block_size:
            return
        keys = block_extra_keys(self.revision, request.cache_salt)
        parent = hashes[-1] if hashes else None
        hashes.extend(
            hash_blocks(request.all_token_ids, self.block_size, keys, parent, len(hashes))
        )

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Publish the request's full blocks among its first `num_tokens` tokens."""
        if not self.enable_caching:
            return
        self._update_hashes(request)
        num_full = min(num_tokens // self.block_size, len(request.block_hashes))
        start = self._num_cached_blocks.get(request.request_id, 0)
        if num_full <= start:
            return
        blocks: Sequence[KVCacheBlock] = self._req_blocks[request.request_id]
        self.pool.cache_full_blocks(blocks, request.block_hashes[:num_full], start)
        self._num_cached_blocks[request.request_id] = num_full
