"""How one unified-attention launch covers a varlen batch: query tiles, tile sizes, KV splits.

A program of the attention kernel takes one *query tile* (up to `block_q` consecutive query
tokens of one sequence) for one KV head, with that head's whole group of query heads: its
`block_m = block_q * group_pad` rows fill a matrix-unit tile even for a single decode token.
The tiles are listed on the host, once per step, from the host copy of `query_start_loc`, so
the kernel never searches for its sequence. With few tiles and long contexts the key range is
cut into `num_splits` pieces run by separate programs (flash-decoding) and merged after.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# Key tokens per inner-loop step (any page size: each key looks its block up). float32
# runs its IEEE dot on CUDA cores, whose operands take far more registers than a tensor-core
# tile: it gets narrower tiles (16 rows, 32 keys), without which ptxas spills kilobytes per
# thread to local memory (`bench/kernel_resources.py`, docs/performance.md).
TILE_N = 64
TILE_N_FP32 = 32
# Below this many keys per split, splitting costs more in the merge than it gains.
MIN_KEYS_PER_SPLIT = 256
MAX_SPLITS = 16


@dataclass(frozen=True)
class AttentionPlan:
    """One step's launch geometry; the tensors live on the attention's device."""

    tile_seq: torch.Tensor  # [num_tiles] int32: the sequence of each query tile
    tile_start: torch.Tensor  # [num_tiles] int32: its first query, counted within the sequence
    block_q: int  # query tokens per tile
    block_m: int  # rows per program: block_q * group_pad
    tile_n: int  # keys per inner step
    num_splits: int  # programs sharing one tile's key range

    @property
    def num_tiles(self) -> int:
        return self.tile_seq.shape[0]


def next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def block_shape(
    max_query_len: int, group: int, dtype: torch.dtype = torch.bfloat16
) -> tuple[int, int]:
    """(block_q, block_m): 16 rows when every sequence's queries fit in them (decodes) or
    the dtype is float32, 64 when longer prefill chunks are in the batch; always at least
    one whole GQA group."""
    group_pad = next_power_of_2(group)
    narrow = dtype == torch.float32 or max_query_len == 1 or max_query_len * group_pad <= 16
    rows = 16 if narrow else 64
    block_m = max(rows, group_pad)
    return block_m // group_pad, block_m


def device_num_sms(device: torch.device) -> int | None:
    """Multiprocessors of a CUDA device; None elsewhere (no split-KV planning)."""
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_properties(device).multi_processor_count


def choose_num_splits(num_programs: int, max_seq_len: int, num_sms: int | None) -> int:
    """Enough splits to give every multiprocessor two programs, when the contexts are long
    enough to share; 1 off the GPU (`num_sms` None)."""
    if num_sms is None or num_programs >= 2 * num_sms:
        return 1
    wanted = -(-2 * num_sms // max(num_programs, 1))
    by_length = max(1, max_seq_len // MIN_KEYS_PER_SPLIT)
    return max(1, min(wanted, by_length, MAX_SPLITS))


def plan_attention(
    query_start_loc: np.ndarray,  # [B + 1] int, host copy
    max_seq_len: int,
    num_kv_heads: int,
    group: int,
    device: torch.device,
    *,
    num_sms: int | None = None,
    num_splits: int | None = None,
    tile_n: int | None = None,
    dtype: torch.dtype = torch.bfloat16,
) -> AttentionPlan:
    """The tiles of one batch for queries and cache of `dtype`. `num_splits` None chooses
    by `choose_num_splits`; `tile_n` None by the dtype."""
    query_lens = np.diff(query_start_loc).astype(np.int64)  # [B]
    block_q, block_m = block_shape(int(query_lens.max(initial=1)), group, dtype)
    if tile_n is None:
        tile_n = TILE_N_FP32 if dtype == torch.float32 else TILE_N
    tiles_per_seq = -(-query_lens // block_q)  # [B]
    tile_seq = np.repeat(np.arange(len(query_lens)), tiles_per_seq)
    first_tile = np.cumsum(tiles_per_seq) - tiles_per_seq  # [B]
    tile_start = (np.arange(len(tile_seq)) - first_tile[tile_seq]) * block_q
    if num_splits is None:
        num_splits = choose_num_splits(len(tile_seq) * num_kv_heads, max_seq_len, num_sms)
    if num_splits < 1:
        raise ValueError(f"num_splits must be at least 1, got {num_splits}")
    return AttentionPlan(
        tile_seq=torch.from_numpy(tile_seq.astype(np.int32)).to(device),
        tile_start=torch.from_numpy(tile_start.astype(np.int32)).to(device),
        block_q=block_q,
        block_m=block_m,
        tile_n=tile_n,
        num_splits=num_splits,
    )
