"""Tensor parallelism: one rank's place in its group, the slice of each weight it holds, and
the collectives its layers call.

Rank r of N holds a contiguous 1/N of the attention heads, of the MLP's intermediate features
and of the vocabulary. KV heads are split the same way when there are at least N of them, and
replicated otherwise (rank r holds KV head r // (N / num_kv_heads), the one its query heads
read), as vLLM does. At N = 1 nothing is split and no collective runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from tandem.engine.core.config import ModelConfig, check_tensor_parallel_size

# Collectives that no peer answers within this long fail instead of hanging forever.
COLLECTIVE_TIMEOUT = timedelta(minutes=10)


def kv_head_range(num_kv_heads: int, rank: int, size: int) -> tuple[int, int]:
    """(first KV head, count) that rank `rank` of `size` caches: a contiguous 1/size of
    them, or the one its query heads read when there are fewer heads than ranks."""
    if num_kv_heads >= size:
        per = num_kv_heads // size
        return rank * per, per
    return rank // (size // num_kv_heads), 1


@dataclass(frozen=True)
class RankShape:
    """What one rank holds of the model: counts and where its slices start in the checkpoint."""

    num_heads: int
    head_start: int
    num_kv_heads: int
    kv_head_start: int
    intermediate_size: int
    intermediate_start: int
    vocab_per_rank: int  # ceil(V / N): the last rank's slice may be shorter (zero padded)
    vocab_start: int

    @classmethod
    def of(cls, model: ModelConfig, rank: int, size: int) -> RankShape:
        check_tensor_parallel_size(model, size)
        heads = model.num_heads // size
        kv_start, kv_heads = kv_head_range(model.num_kv_heads, rank, size)
        inter = model.intermediate_size // size
        vocab = -(-model.vocab_size // size)
        return cls(
            heads, rank * heads, kv_heads, kv_start, inter, rank * inter, vocab, rank * vocab
        )


class TensorParallel:
    """One rank's view of its tensor-parallel group. Layers hold it; `connect` gives it the
    process group once every rank has loaded (before that, and always at size 1, collectives
    are never called)."""

    def __init__(self, model: ModelConfig, rank: int = 0, size: int = 1) -> None:
        self.rank = rank
        self.size = size
        self.shape = RankShape.of(model, rank, size)
        self.group: dist.ProcessGroup | None = None

    def connect(self, store: dist.Store, device: torch.device) -> None:
        """Join the group: NCCL between GPUs, gloo over loopback on the CPU. Blocks until
        every rank has joined."""
        if device.type == "cuda":
            self.group = dist.ProcessGroupNCCL(store, self.rank, self.size)
            return
        options = dist.ProcessGroupGloo._Options()
        options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
        options._timeout = COLLECTIVE_TIMEOUT
        self.group = dist.ProcessGroupGloo(store, self.rank, self.size, options)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks, in place; every rank gets the sum."""
        if self.size > 1:
            self.group.allreduce([x]).wait()
        return x

    def gather_last_dim(self, x: torch.Tensor) -> torch.Tensor | None:
        """[S, P] per rank -> [S, N * P] on rank 0 (rank order), None on the others."""
        if self.size == 1:
            return x
        x = x.contiguous()
        options = dist.GatherOptions()
        options.rootRank = 0
        parts = [[torch.empty_like(x) for _ in range(self.size)]] if self.rank == 0 else []
        self.group.gather(parts, [x], options).wait()
        return torch.cat(parts[0], dim=-1) if self.rank == 0 else None
