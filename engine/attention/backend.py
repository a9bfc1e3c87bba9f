"""The attention-backend interface and the metadata one step hands to every layer.

The runner builds one `CommonAttentionMetadata` per step; the backend turns it once into
its own metadata (any planning it needs), and every layer receives that object explicitly.
Nothing is read from a global.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class CommonAttentionMetadata:
    """One step's flattened varlen batch, as every backend sees it.

    Sequence b owns query tokens `query_start_loc[b]:query_start_loc[b+1]`, which are its
    last ones: its context is `seq_lens[b]` tokens, stored in the blocks of row b of
    `block_tables`. Host copies let a backend plan without a device sync.
    """

    query_start_loc: torch.Tensor  # [B + 1] int32
    seq_lens: torch.Tensor  # [B] int32
    block_tables: torch.Tensor  # [B, max_blocks] int32
    slot_mapping: torch.Tensor  # [T] int64
    query_start_loc_cpu: np.ndarray  # [B + 1] int32
    seq_lens_cpu: np.ndarray  # [B] int32
    block_tables_cpu: np.ndarray  # [B, max_blocks] int32
    max_query_len: int
    max_seq_len: int

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)

    @classmethod
    def from_host(
        cls,
        query_start_loc: np.ndarray,  # [B + 1] int32
        seq_lens: np.ndarray,  # [B] int32
        block_tables: np.ndarray,  # [B, max_blocks] int32
        slot_mapping: np.ndarray,  # [T] int64
        device: torch.device,
    ) -> CommonAttentionMetadata:
        """The step's metadata from its host arrays (kept as the host copies)."""
        return cls(
            query_start_loc=torch.from_numpy(query_start_loc).to(device),
            seq_lens=torch.from_numpy(seq_lens).to(device),
            block_tables=torch.from_numpy(block_tables).to(device),
            slot_mapping=torch.from_numpy(slot_mapping).to(device),
            query_start_loc_cpu=query_start_loc,
            seq_lens_cpu=seq_lens,
            block_tables_cpu=block_tables,
            max_query_len=int(np.diff(query_start_loc).max()),
            max_seq_len=int(seq_lens.max()),
        )


class AttentionBackend(ABC):
    """Writes a layer's new K/V into the paged cache and attends over it.

    `build` is called once per step; `forward` once per layer with the result of `build`.
    """

    @abstractmethod
    def build(self, common: CommonAttentionMetadata) -> Any:
        """Backend metadata for one step. Owned by the caller; valid for that step only."""

    @abstractmethod
    def forward(
        self,
        query: torch.Tensor,  # [T, Hq, D]
        key: torch.Tensor,  # [T, Hkv, D]
        value: torch.Tensor,  # [T, Hkv, D]
        kv_layer: torch.Tensor,  # [N, 2, bs, Hkv, D]; new K/V written in place
        metadata: Any,
        scale: float,
    ) -> torch.Tensor:  # [T, Hq, D]
        """Store key/value at the metadata's slots, then return causal attention output."""


@dataclass(frozen=True)
class AttentionBatch:
    """What a model's forward receives: the backend and this step's metadata for it."""

    backend: AttentionBackend
    metadata: Any
