"""KV heads between ranks of different tensor-parallel sizes: the pieces, the staging and
re-packing, and real NIXL writes between agents (one per rank, in this process) that leave
every decode rank holding exactly its heads of the blocks."""

from __future__ import annotations

import time

import pytest
import torch

from tandem.engine.models.tensor_parallel import kv_head_range
from tandem.engine.transfer.kv_heads import Piece, cuts_of, plan_pieces, repack, stage
from tandem.engine.transfer.kv_staging import staging_cuts
from tandem.engine.transfer.nixl_agent import KVTransferAgent, new_agent_name
from tandem.engine.transfer.rank_kv import PeerPiece, RankKV
from tests.bounds import HANG_S

NUM_BLOCKS, LAYERS, BLOCK, HEAD_DIM = 6, 2, 4, 8


def ranges(num_heads: int, size: int) -> list[tuple[int, int]]:
    """Each rank's (first KV head, count), as the engine's ranks hold them."""
    return [kv_head_range(num_heads, rank, size) for rank in range(size)]


def test_pieces_pair_each_destination_head_with_its_first_holder():
    assert plan_pieces([(0, 4)], [(0, 2), (2, 2)]) == [Piece(0, 0, 0, 2), Piece(0, 1, 2, 4)]
    assert plan_pieces([(0, 2), (2, 2)], [(0, 4)]) == [Piece(0, 0, 0, 2), Piece(1, 0, 2, 4)]
    assert plan_pieces([(0, 2), (2, 2)], [(0, 2), (2, 2)]) == [
        Piece(0, 0, 0, 2),
        Piece(1, 1, 2, 4),
    ]
    # replicated on both sides: the first holder serves every replica
    assert plan_pieces([(0, 1), (0, 1)], [(0, 1), (0, 1)]) == [
        Piece(0, 0, 0, 1),
        Piece(0, 1, 0, 1),
    ]
    # uneven overlaps (6 heads, 2 -> 3 ranks)
    assert plan_pieces([(0, 3), (3, 3)], [(0, 2), (2, 2), (4, 2)]) == [
        Piece(0, 0, 0, 2), Piece(0, 1, 2, 3), Piece(1, 1, 3, 4), Piece(1, 2, 4, 6),
    ]  # fmt: skip
    with pytest.raises(ValueError, match="no source rank holds KV head 2"):
        plan_pieces([(0, 2)], [(0, 4)])


def test_a_rank_holds_a_split_of_the_kv_heads_or_a_replica_of_one():
    assert ranges(8, 2) == [(0, 4), (4, 4)]
    assert ranges(2, 4) == [(0, 1), (0, 1), (1, 1), (1, 1)]  # the head its query heads read


def test_stage_then_repack_restores_the_blocks():
    kv = torch.randn(NUM_BLOCKS, LAYERS, 2, BLOCK, 4, HEAD_DIM)  # [NB, L, 2, bs, h, D]
    staging = torch.zeros(NUM_BLOCKS, kv[0].numel())
    cuts = [(0, 1), (1, 3)]
    stage(kv, staging, [1, 4], cuts)
    per_head = kv[0].numel() // 4
    assert torch.equal(staging[1, :per_head].view(LAYERS, 2, BLOCK, 1, HEAD_DIM), kv[1][..., :1, :])
    assert torch.equal(staging[4, per_head:].view(LAYERS, 2, BLOCK, 3, HEAD_DIM), kv[4][..., 1:, :])
    assert not staging[0].any()  # only the staged blocks are touched
    back = staging.view(kv.shape).clone()
    repack(back, [1, 4], cuts)
    assert torch.equal(back[1], kv[1]) and torch.equal(back[4], kv[4])


def _rank_kvs(
    full: torch.Tensor, heads: list[tuple[int, int]], fill: bool, peer_size: int = 0
) -> list[RankKV]:
    """One agent per rank over a cache of its heads (a copy of `full`'s, or zeros), with
    the staging mirrors planned for writing to nodes of `peer_size` ranks."""
    total, peers = full.shape[4], (peer_size,) if peer_size else ()
    out = []
    for rank, (start, count) in enumerate(heads):
        cache = full[..., start : start + count, :].clone().contiguous()
        if not fill:
            cache.zero_()
        cuts = staging_cuts(total, len(heads), rank, peers)
        agent = KVTransferAgent(new_agent_name("t"), cache, start, total)
        out.append(RankKV(agent, cache, cuts))
    return out


def _never_allocate(*args, **kwargs):
    raise AssertionError("a write allocated a tensor")


@pytest.mark.parametrize(
    ("num_heads", "src_size", "dst_size"),
    [(4, 1, 1), (4, 2, 2), (4, 1, 2), (4, 2, 1), (4, 1, 4), (4, 4, 2), (2, 1, 4), (2, 4, 1)],
)
def test_writes_between_tp_sizes_give_each_decode_rank_its_heads(
    num_heads, src_size, dst_size, monkeypatch
):
    full = torch.randn(NUM_BLOCKS, LAYERS, 2, BLOCK, num_heads, HEAD_DIM)
    src = _rank_kvs(full, ranges(num_heads, src_size), fill=True, peer_size=dst_size)
    dst = _rank_kvs(full, ranges(num_heads, dst_size), fill=False)
    mirrors = [r.num_mirrors for r in src]
    monkeypatch.setattr("tandem.engine.transfer.rank_kv.torch.zeros", _never_allocate)
    src_ids, dst_ids = [0, 1, 2, 5], [3, 4, 5, 1]  # one run of 3 adjacent on both sides
    pieces = plan_pieces([r.heads for r in src], [r.heads for r in dst])
    for rank, rank_kv in enumerate(src):
        parts = [PeerPiece(dst[p.dst].agent.info(), p) for p in pieces if p.src == rank]
        if parts:
            rank_kv.write(rank, parts, src_ids, dst_ids)
    _wait_for_writes(src, dst)
    assert [r.num_mirrors for r in src] == mirrors  # planned with the cache, never at a write
    for rank, rank_kv in enumerate(dst):
        cuts = cuts_of([p for p in pieces if p.dst == rank], rank_kv.heads)
        if cuts != [(0, rank_kv.heads[1])]:
            rank_kv.repack(dst_ids, cuts)
        start, count = rank_kv.heads
        for s, d in zip(src_ids, dst_ids):
            assert torch.equal(rank_kv.kv_cache[d], full[s][..., start : start + count, :])
        untouched = [b for b in range(NUM_BLOCKS) if b not in dst_ids]
        assert not rank_kv.kv_cache[untouched].any()


def _wait_for_writes(src: list[RankKV], dst: list[RankKV]) -> None:
    """Poll every source's writes (the destinations' agents progress meanwhile)."""
    deadline = time.monotonic() + HANG_S
    ended: list[str] = []
    while any(r.num_in_flight for r in src):
        assert time.monotonic() < deadline, "writes never ended"
        for r in src:
            ended += [state for _, state in r.poll()]
        for r in dst:
            r.agent.progress()
    assert "ERR" not in ended


def test_a_write_needing_a_mirror_not_planned_is_refused_before_posting():
    full = torch.randn(NUM_BLOCKS, LAYERS, 2, BLOCK, 4, HEAD_DIM)
    (src,) = _rank_kvs(full, ranges(4, 1), fill=True)  # planned for equal sizes only
    dst = _rank_kvs(full, ranges(4, 2), fill=False)
    pieces = plan_pieces([src.heads], [d.heads for d in dst])
    parts = [PeerPiece(d.agent.info(), p) for d, p in zip(dst, pieces)]
    with pytest.raises(ValueError, match="--peer-tensor-parallel-sizes"):
        src.write(0, parts, [0], [1])
    assert src.num_in_flight == 0 and src.num_mirrors == 0
