"""The GPU attention backend: Triton's KV write and one unified paged-attention launch per
layer for the whole mixed batch.

`build` plans the query tiles once per step from the host copies (no device sync); every
layer then reuses the plan. The kernels are imported when the backend is made, so the CPU
engine never needs Triton.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tandem.engine.attention.backend import AttentionBackend, CommonAttentionMetadata
from tandem.kernels.attention_plan import AttentionPlan, plan_attention


@dataclass(frozen=True)
class TritonAttentionMetadata:
    slot_mapping: torch.Tensor  # [T] int64
    block_tables: torch.Tensor  # [B, MB] int32
    seq_lens: torch.Tensor  # [B] int32
    query_start_loc: torch.Tensor  # [B + 1] int32
    plan: AttentionPlan


class TritonAttentionBackend(AttentionBackend):
    def __init__(
        self,
        num_kv_heads: int,
        group: int,
        num_sms: int | None,
        *,
        sliding_window: int = 0,
        softcap: float = 0.0,
        num_splits: int | None = None,
        dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        """`num_sms` (None off the GPU) sizes the split-KV choice; `num_splits` forces it.
        `dtype`, the model's, picks the tile shapes."""
        from tandem.kernels.kv_write import write_kv
        from tandem.kernels.paged_attention import unified_attention

        self._write_kv = write_kv
        self._attention = unified_attention
        self.num_kv_heads = num_kv_heads
        self.group = group
        self.num_sms = num_sms
        self.sliding_window = sliding_window
        self.softcap = softcap
        self.num_splits = num_splits
        self.dtype = dtype

    def build(self, common: CommonAttentionMetadata) -> TritonAttentionMetadata:
        plan = plan_attention(
            common.query_start_loc_cpu,
            common.max_seq_len,
            self.num_kv_heads,
            self.group,
            common.slot_mapping.device,
            num_sms=self.num_sms,
            num_splits=self.num_splits,
            dtype=self.dtype,
        )
        return TritonAttentionMetadata(
            slot_mapping=common.slot_mapping,
            block_tables=common.block_tables,
            seq_lens=common.seq_lens,
            query_start_loc=common.query_start_loc,
            plan=plan,
        )

    def forward(
        self,
        query: torch.Tensor,  # [T, Hq, D]
        key: torch.Tensor,  # [T, Hkv, D]
        value: torch.Tensor,  # [T, Hkv, D]
        kv_layer: torch.Tensor,  # [N, 2, bs, Hkv, D]
        metadata: TritonAttentionMetadata,
        scale: float,
    ) -> torch.Tensor:  # [T, Hq, D]
        self._write_kv(key, value, kv_layer, metadata.slot_mapping)
        return self._attention(
            query,
            kv_layer,
            metadata.block_tables,
            metadata.seq_lens,
            metadata.query_start_loc,
            metadata.plan,
            scale,
            sliding_window=self.sliding_window,
            softcap=self.softcap,
        )
