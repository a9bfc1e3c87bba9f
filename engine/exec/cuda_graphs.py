"""Decode-only steps replayed from CUDA graphs captured at bucketed batch sizes.

A decode step launches a few kernels per layer, each short; on a GPU the launches, not the
work, would bound small batches. So every decode-only step runs through static input
buffers: the step's tokens are copied into the first rows of the smallest bucket that holds
them, the remaining rows are padding (slot -1: no KV write; context 0: attention of zeros),
and the graph captured for that bucket is replayed. Mixed prefill/decode steps run eagerly.

Off the GPU (the Triton interpreter in tests) nothing is captured; the same buffers and
padding run eagerly, so this path is tested where no GPU is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from tandem.engine.attention.backend import (
    AttentionBackend,
    AttentionBatch,
    CommonAttentionMetadata,
)

# (input_ids [B], positions [B], attn) -> hidden [B, H]
Forward = Callable[[torch.Tensor, torch.Tensor, AttentionBatch], torch.Tensor]

MAX_GRAPH_BATCH = 256


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 8, up to the engine's sequence limit (capped)."""
    limit = min(max_num_seqs, MAX_GRAPH_BATCH)
    sizes = [s for s in (1, 2, 4) if s < limit] + list(range(8, limit + 8, 8))
    return sorted({min(s, limit) for s in sizes})


@dataclass
class _Bucket:
    attn: AttentionBatch
    graph: torch.cuda.CUDAGraph | None = None
    hidden: torch.Tensor | None = None  # [size, H]: the captured output


class DecodeGraphs:
    """Owns the static buffers and one captured graph per bucket size."""

    def __init__(
        self,
        forward: Forward,
        backend: AttentionBackend,
        max_num_seqs: int,
        max_blocks_per_seq: int,
        max_model_len: int,
        device: torch.device,
    ) -> None:
        self.forward = forward
        self.sizes = graph_batch_sizes(max_num_seqs)
        self.device = device
        self.capture_graphs = device.type == "cuda"
        size = self.sizes[-1]
        self.input_ids = torch.zeros(size, dtype=torch.long, device=device)  # [B]
        self.positions = torch.zeros(size, dtype=torch.long, device=device)  # [B]
        self.slot_mapping = torch.full((size,), -1, dtype=torch.long, device=device)  # [B]
        self.seq_lens = torch.zeros(size, dtype=torch.int32, device=device)  # [B]
        self.query_start_loc = torch.arange(size + 1, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(
            (size, max_blocks_per_seq), dtype=torch.int32, device=device
        )  # [B, MB]
        self.buckets = {s: _Bucket(self._attention(backend, s, max_model_len)) for s in self.sizes}
        self._pool = None

    def _attention(
        self, backend: AttentionBackend, size: int, max_model_len: int
    ) -> AttentionBatch:
        """The bucket's metadata over views of the static buffers, planned for the longest
        context (the plan must hold for every step the graph replays)."""
        common = CommonAttentionMetadata(
            query_start_loc=self.query_start_loc[: size + 1],
            seq_lens=self.seq_lens[:size],
            block_tables=self.block_tables[:size],
            slot_mapping=self.slot_mapping[:size],
            query_start_loc_cpu=np.arange(size + 1, dtype=np.int32),
            seq_lens_cpu=np.full(size, max_model_len, dtype=np.int32),
            block_tables_cpu=np.zeros((size, self.block_tables.shape[1]), dtype=np.int32),
            max_query_len=1,
            max_seq_len=max_model_len,
        )
        return AttentionBatch(backend, backend.build(common))

    def can_run(self, common: CommonAttentionMetadata) -> bool:
        """Decode-only, within the largest bucket, block tables within the static width."""
        return (
            common.max_query_len == 1
            and common.num_seqs <= self.sizes[-1]
            and common.block_tables.shape[1] <= self.block_tables.shape[1]
        )

    def capture(self) -> None:
        """Capture every bucket, largest first so smaller graphs reuse its memory pool. A
        warm-up run first compiles the kernels outside the capture. No-op off the GPU."""
        if not self.capture_graphs:
            return
        for size in reversed(self.sizes):
            bucket = self.buckets[size]
            self._pad(0, size)
            self._run_eager(size)  # compile and warm up
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                bucket.hidden = self._run_eager(size)
            self._pool = graph.pool()
            bucket.graph = graph

    def run(
        self,
        input_ids: torch.Tensor,  # [B]
        positions: torch.Tensor,  # [B]
        common: CommonAttentionMetadata,
    ) -> torch.Tensor:  # [B, H]
        """One decode-only step: copy in, pad, replay (or run eagerly off the GPU)."""
        num_seqs = common.num_seqs
        size = next(s for s in self.sizes if s >= num_seqs)
        width = common.block_tables.shape[1]
        self.input_ids[:num_seqs].copy_(input_ids)
        self.positions[:num_seqs].copy_(positions)
        self.slot_mapping[:num_seqs].copy_(common.slot_mapping)
        self.seq_lens[:num_seqs].copy_(common.seq_lens)
        self.block_tables[:num_seqs, :width].copy_(common.block_tables)
        self._pad(num_seqs, size)
        bucket = self.buckets[size]
        if bucket.graph is None:
            return self._run_eager(size)[:num_seqs]
        bucket.graph.replay()
        return bucket.hidden[:num_seqs]

    def _pad(self, start: int, end: int) -> None:
        """Rows start..end: no KV write, no key to attend, a valid token and position."""
        self.slot_mapping[start:end].fill_(-1)
        self.seq_lens[start:end].fill_(0)
        self.input_ids[start:end].fill_(0)
        self.positions[start:end].fill_(0)

    def _run_eager(self, size: int) -> torch.Tensor:  # [size, H]
        attn = self.buckets[size].attn
        return self.forward(self.input_ids[:size], self.positions[:size], attn)
