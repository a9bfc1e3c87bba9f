"""Which KV heads go from which rank of a prefill node to which rank of a decode node, and
the NIXL descriptors that carry them.

Every rank caches the design's block-major `[num_blocks, L, 2, bs, its heads, D]` with the
same block ids on every rank. A rank's heads are one contiguous range `(start, count)` of the
model's KV heads (replicated ranks hold the same range). A *piece* is the heads that one
source rank sends one destination rank: the intersection of their ranges, each head taken
from the lowest source rank holding it. On the wire a piece is the bytes of a block over
only its heads, token-major (`[L, 2, bs, piece heads, D]`):

- a piece that is the source rank's whole range is its block as it lies (direct);
- otherwise the source re-packs its block into a staging mirror first: the block's pieces
  one after the other, in head order (`RankKV`);
- a piece that is the destination rank's whole range lands in its block as it lies;
- otherwise the destination's block receives its pieces one after the other, in head order,
  and the decode node re-packs the block in place once every piece has landed (`repack`).

Runs of blocks adjacent on both sides merge into one descriptor only when both ends are
direct (equal ranges, as at equal TP sizes); otherwise a descriptor is one piece of one
block. docs/disaggregation.md has the counts per TP pair.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from msgspec.structs import replace

from tandem.engine.transfer.descriptors import block_runs, run_descs
from tandem.engine.transfer.messages import KVLayout

HeadRange = tuple[int, int]  # (first KV head, number of heads)
Desc = tuple[int, int, int]  # NIXL (address, bytes, device)


@dataclass(frozen=True)
class Piece:
    """Heads `[start, end)` go from source rank `src` to destination rank `dst`."""

    src: int
    dst: int
    start: int
    end: int

    @property
    def num_heads(self) -> int:
        return self.end - self.start


def plan_pieces(src: list[HeadRange], dst: list[HeadRange]) -> list[Piece]:
    """Every piece from source ranks `src` to destination ranks `dst`, by destination rank
    then head. Raises ValueError when a destination head is held by no source rank."""
    pieces = []
    for d, (d_start, d_count) in enumerate(dst):
        head = d_start
        while head < d_start + d_count:
            s = _holder(src, head)
            s_start, s_count = src[s]
            end = min(d_start + d_count, s_start + s_count)
            pieces.append(Piece(s, d, head, end))
            head = end
    return pieces


def _holder(src: list[HeadRange], head: int) -> int:
    for rank, (start, count) in enumerate(src):
        if start <= head < start + count:
            return rank
    raise ValueError(f"no source rank holds KV head {head}")


def head_range(layout: KVLayout) -> HeadRange:
    return (layout.kv_head_start, layout.num_kv_heads)


def head_bytes(layout: KVLayout) -> int:
    """Bytes of one head's part of a block (every layer's K and V, every token)."""
    return layout.block_bytes // layout.num_kv_heads


def is_whole(piece: Piece, heads: HeadRange) -> bool:
    return (piece.start, piece.num_heads) == heads


def piece_descs(
    src: KVLayout,
    src_base: int,
    src_whole: bool,
    dst: KVLayout,
    piece: Piece,
    src_ids: list[int],
    dst_ids: list[int],
) -> tuple[list[Desc], list[Desc]]:
    """(source, destination) descriptors of one piece over the blocks `src_ids` ->
    `dst_ids`. `src_base`: where the source's blocks start (its cache when `src_whole`, else
    its staging mirror of the same block size)."""
    if src_whole and is_whole(piece, head_range(dst)):  # both whole blocks: runs merge
        runs = block_runs(src_ids, dst_ids)
        return run_descs(replace(src, base_addr=src_base), runs, 0), run_descs(dst, runs, 1)
    size = piece.num_heads * head_bytes(src)
    src_off = (piece.start - src.kv_head_start) * head_bytes(src)
    dst_off = (piece.start - dst.kv_head_start) * head_bytes(dst)
    local = [(src_base + s * src.block_bytes + src_off, size, src.device_id) for s in src_ids]
    far = [(dst.base_addr + d * dst.block_bytes + dst_off, size, dst.device_id) for d in dst_ids]
    return local, far


def num_descs(
    piece: Piece, src: HeadRange, dst: HeadRange, src_ids: list[int], dst_ids: list[int]
) -> int:
    """Descriptors `piece_descs` makes for a piece between ranks holding `src` and `dst`."""
    if is_whole(piece, src) and is_whole(piece, dst):
        return len(block_runs(src_ids, dst_ids))
    return len(src_ids)


def stage(
    kv_cache: torch.Tensor, staging: torch.Tensor, block_ids: list[int], cuts: list[HeadRange]
) -> None:
    """Copy blocks `block_ids` of `kv_cache` [NB, L, 2, bs, h, D] into `staging` [NB, E] as
    the pieces `cuts` (relative head ranges covering `0..h`, in order) one after another:
    one strided copy per piece and run of adjacent blocks."""
    for start, n in _runs(block_ids):
        blocks = kv_cache[start : start + n]  # [n, L, 2, bs, h, D], a view
        for (a, count), part in zip(cuts, _pieces_of(staging[start : start + n], blocks, cuts)):
            part.copy_(blocks[..., a : a + count, :])


def repack(kv_cache: torch.Tensor, block_ids: list[int], cuts: list[HeadRange]) -> None:
    """The inverse of `stage`, in place: blocks `block_ids` hold the pieces `cuts` one after
    another; lay them out token-major again ([L, 2, bs, h, D] per block)."""
    for start, n in _runs(block_ids):
        blocks = kv_cache[start : start + n]  # [n, L, 2, bs, h, D], a view
        packed = blocks.reshape(n, -1).clone()  # [n, E]
        for (a, count), part in zip(cuts, _pieces_of(packed, blocks, cuts)):
            blocks[..., a : a + count, :].copy_(part)


def _pieces_of(
    flat: torch.Tensor, blocks: torch.Tensor, cuts: list[HeadRange]
) -> list[torch.Tensor]:
    """Views of `flat` [n, E] as the pieces `cuts`, each [n, L, 2, bs, count, D]."""
    per_head = flat.shape[1] // blocks.shape[-2]
    views, offset = [], 0
    for _, count in cuts:
        shape = (*blocks.shape[:-2], count, blocks.shape[-1])
        views.append(flat[:, offset : offset + count * per_head].view(shape))
        offset += count * per_head
    return views


def _runs(block_ids: list[int]) -> list[tuple[int, int]]:
    """(first block, count) of each run of consecutive ids."""
    runs: list[tuple[int, int]] = []
    for block in block_ids:
        if runs and block == runs[-1][0] + runs[-1][1]:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((block, 1))
    return runs


def cuts_of(pieces: list[Piece], heads: HeadRange) -> list[HeadRange]:
    """Distinct pieces as head ranges relative to `heads`, in head order."""
    start = heads[0]
    return sorted({(p.start - start, p.num_heads) for p in pieces})
