"""The CPU attention backend: plain torch, reading K/V through block tables.

Decoding sequences (one query token) attend in one batched call; prefill chunks attend
one sequence at a time, so padding never multiplies a long chunk by the batch size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tandem.engine.attention import AttentionBackend, CommonAttentionMetadata
from tandem.kernels.reference import attention_ref, gather_kv_ref, write_kv_ref


@dataclass(frozen=True)
class PrefillSlice:
    start: int
    end: int
    block_table: torch.Tensor  # [1, num_blocks] int
    positions: torch.Tensor  # [1, end - start] int
    seq_len: torch.Tensor  # [1] int


@dataclass(frozen=True)
class TorchAttentionMetadata:
    slot_mapping: torch.Tensor  # [T] int64
    decode_token_idx: torch.Tensor  # [Bd] int64
    decode_block_tables: torch.Tensor  # [Bd, MBd] int
    decode_positions: torch.Tensor  # [Bd, 1] int
    decode_seq_lens: torch.Tensor  # [Bd] int
    prefills: tuple[PrefillSlice, ...]


class TorchAttentionBackend(AttentionBackend):
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size

    def build(self, common: CommonAttentionMetadata) -> TorchAttentionMetadata:
        qsl = common.query_start_loc_cpu
        seq_lens = common.seq_lens_cpu
        query_lens = np.diff(qsl)
        device = common.slot_mapping.device
        decode = np.flatnonzero(query_lens == 1)
        dec_blocks = -(-int(seq_lens[decode].max()) // self.block_size) if len(decode) else 0
        return TorchAttentionMetadata(
            slot_mapping=common.slot_mapping,
            decode_token_idx=torch.from_numpy(qsl[decode].astype(np.int64)).to(device),
            decode_block_tables=torch.from_numpy(
                np.ascontiguousarray(common.block_tables_cpu[decode, :dec_blocks])
            ).to(device),
            decode_positions=torch.from_numpy(seq_lens[decode, None] - 1).to(device),
            decode_seq_lens=torch.from_numpy(seq_lens[decode]).to(device),
            prefills=tuple(
                self._prefill_slice(common, int(b), device) for b in np.flatnonzero(query_lens > 1)
            ),
        )

    def _prefill_slice(
        self, common: CommonAttentionMetadata, b: int, device: torch.device
    ) -> PrefillSlice:
        start, end = int(common.query_start_loc_cpu[b]), int(common.query_start_loc_cpu[b + 1])
        seq_len = int(common.seq_lens_cpu[b])
        num_blocks = -(-seq_len // self.block_size)
        table = common.block_tables_cpu[b : b + 1, :num_blocks]
        positions = torch.arange(seq_len - (end - start), seq_len, device=device)
        return PrefillSlice(
            start=start,
            end=end,
            block_table=torch.from_numpy(np.ascontiguousarray(table)).to(device),
            positions=positions[None],
            seq_len=torch.tensor([seq_len], device=device),
        )

    def forward(
        self,
        query: torch.Tensor,  # [T, Hq, D]
        key: torch.Tensor,  # [T, Hkv, D]
        value: torch.Tensor,  # [T, Hkv, D]
        kv_layer: torch.Tensor,  # [N, 2, bs, Hkv, D]
        metadata: TorchAttentionMetadata,
        scale: float,
    ) -> torch.Tensor:  # [T, Hq, D]
        write_kv_ref(key, value, kv_layer, metadata.slot_mapping)
        out = torch.empty_like(query)
        if len(metadata.decode_token_idx):
            k, v = gather_kv_ref(kv_layer, metadata.decode_block_tables)
            q = query[metadata.decode_token_idx][:, None]  # [Bd, 1, Hq, D]
            o = attention_ref(q, k, v, metadata.decode_positions, metadata.decode_seq_lens, scale)
            out[metadata.decode_token_idx] = o[:, 0]
        for p in metadata.prefills:
            k, v = gather_kv_ref(kv_layer, p.block_table)
            q = query[p.start : p.end][None]  # [1, Q, Hq, D]
            out[p.start : p.end] = attention_ref(q, k, v, p.positions, p.seq_len, scale)[0]
        return out
