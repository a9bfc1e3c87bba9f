"""Random varlen batches over a paged cache, with scattered block tables, for the kernel
tests and `bench/kernels.py`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class PagedBatch:
    query: torch.Tensor  # [T, Hq, D]
    kv_layer: torch.Tensor  # [N, 2, bs, Hkv, D]
    block_tables: torch.Tensor  # [B, MB] int32
    seq_lens: torch.Tensor  # [B] int32
    query_start_loc: torch.Tensor  # [B + 1] int32
    query_start_loc_cpu: np.ndarray  # [B + 1] int32

    @property
    def max_seq_len(self) -> int:
        return int(self.seq_lens.max())


def paged_batch(
    query_lens: list[int],
    context_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
    pool_factor: int = 2,
) -> PagedBatch:
    """Sequence b has `context_lens[b]` cached tokens then `query_lens[b]` new ones; its
    blocks are drawn at random from a pool `pool_factor` times the size needed (so tables
    are scattered and, above 1, the pool has blocks no sequence owns). Drawn on `device`."""
    gen = torch.Generator(device).manual_seed(seed)
    seq_lens = [c + q for c, q in zip(context_lens, query_lens)]
    max_blocks = max(1, max(-(-s // block_size) for s in seq_lens))
    num_blocks = pool_factor * max_blocks * len(seq_lens)
    kv_shape = (num_blocks, 2, block_size, num_kv_heads, head_dim)
    kv = torch.randn(kv_shape, generator=gen, device=device, dtype=dtype)
    tables = torch.randperm(num_blocks, generator=gen, device=device)
    tables = tables[: len(seq_lens) * max_blocks]
    qsl = np.zeros(len(query_lens) + 1, dtype=np.int32)
    np.cumsum(query_lens, out=qsl[1:])
    query_shape = (int(qsl[-1]), num_heads, head_dim)
    query = torch.randn(query_shape, generator=gen, device=device, dtype=dtype)
    return PagedBatch(
        query=query,
        kv_layer=kv,
        block_tables=tables.view(len(seq_lens), max_blocks).int(),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_start_loc=torch.from_numpy(qsl).to(device),
        query_start_loc_cpu=qsl,
    )
