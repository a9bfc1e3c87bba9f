"""The staging mirrors a writer's rank needs, planned with its KV cache.

A prefill rank re-packs its blocks into a staging mirror (`RankKV`) when a decode rank wants
only part of its heads: a decode node of another tensor-parallel size. A mirror is as large
as the rank's KV cache, one per distinct split of its heads, so it is sized into the memory
plan (`plan_block_bytes`: the blocks planned leave room for it) and allocated when the node
starts, never by a write: on a full GPU a write-time allocation fails every such write.

A node cannot see its peers' sizes, so it is told them: `CacheConfig.peer_tensor_parallel_sizes`
(`--peer-tensor-parallel-sizes`), the sizes of the decode nodes it may write to. Sizes equal
to its own (and the default, none) need no mirror; a write that would need a mirror not
planned is refused (the decode node falls back), never served by allocating one.
"""

from __future__ import annotations

from tandem.engine.core.config import EngineConfig
from tandem.engine.exec.model_shard import kv_block_bytes
from tandem.engine.models.tensor_parallel import kv_head_range
from tandem.engine.transfer.kv_heads import HeadRange, cuts_of, is_whole, plan_pieces

Cuts = tuple[HeadRange, ...]  # a split of a rank's heads, relative to its first head


def staging_cuts(
    num_kv_heads: int, size: int, rank: int, peer_sizes: tuple[int, ...]
) -> list[Cuts]:
    """The distinct splits rank `rank` of a node of `size` ranks stages its heads into when
    it writes to nodes of `peer_sizes` ranks (empty: every piece is all of its heads)."""
    src = [kv_head_range(num_kv_heads, r, size) for r in range(size)]
    found: list[Cuts] = []
    for peer in peer_sizes:
        dst = [kv_head_range(num_kv_heads, r, peer) for r in range(peer)]
        pieces = [p for p in plan_pieces(src, dst) if p.src == rank]
        if pieces and not all(is_whole(p, src[rank]) for p in pieces):
            cuts = tuple(cuts_of(pieces, src[rank]))
            if cuts not in found:
                found.append(cuts)
    return found


def rank_staging_cuts(config: EngineConfig, rank: int) -> list[Cuts]:
    """The splits rank `rank` of this node allocates a mirror for."""
    peers = config.cache.peer_tensor_parallel_sizes
    return staging_cuts(config.model.num_kv_heads, config.tensor_parallel_size, rank, peers)


def num_staging_mirrors(config: EngineConfig) -> int:
    """Mirrors of its cache the busiest rank of this node allocates."""
    size, heads = config.tensor_parallel_size, config.model.num_kv_heads
    peers = config.cache.peer_tensor_parallel_sizes
    return max(len(staging_cuts(heads, size, rank, peers)) for rank in range(size))


def plan_block_bytes(config: EngineConfig) -> int:
    """Bytes one planned block costs a rank: the block, and its slot in every mirror."""
    return kv_block_bytes(config) * (1 + num_staging_mirrors(config))
