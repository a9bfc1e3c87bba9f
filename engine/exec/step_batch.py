"""One step's model input as plain host arrays: what every tensor-parallel rank needs to run
the step, and nothing of the requests themselves.

Rank 0 flattens its request states (updated by the step's `StepPlan`) into a `StepBatch`;
the other ranks receive it pickled (numpy arrays and ints only) and run the same forward on
their shard. Token ids, sampling state and grammar masks never leave rank 0: it alone
samples, from the logits the ranks gather to it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tandem.engine.attention.backend import CommonAttentionMetadata


@dataclass
class StepBatch:
    """Sequence b computes tokens `query_start_loc[b]:query_start_loc[b+1]` of the flat
    batch; rows `logits_indices` of the hidden states get logits (the last token of each
    sequence that reaches its end this step, in batch order `sample_rows`)."""

    input_ids: np.ndarray  # [T] int64
    positions: np.ndarray  # [T] int64
    query_start_loc: np.ndarray  # [B + 1] int32
    seq_lens: np.ndarray  # [B] int32
    block_tables: np.ndarray  # [B, max_blocks] int32
    slot_mapping: np.ndarray  # [T] int64
    sample_rows: list[int]  # [S] batch rows that sample
    logits_indices: np.ndarray  # [S] int64 token rows of those sequences' last tokens

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    def attention_metadata(self, device: torch.device) -> CommonAttentionMetadata:
        return CommonAttentionMetadata.from_host(
            self.query_start_loc, self.seq_lens, self.block_tables, self.slot_mapping, device
        )

    def model_inputs(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(input_ids [T], positions [T]) on `device`."""
        ids = torch.from_numpy(self.input_ids).to(device)
        return ids, torch.from_numpy(self.positions).to(device)
