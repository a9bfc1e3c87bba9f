"""Linear and embedding layers split across tensor-parallel ranks, loading only their slices.

Each parameter carries a `weight_loader(param, source, shard_id)` that reads its own slice
from `source` (a safetensors `get_slice` handle: `get_shape()` and indexing read only the
bytes asked for), so a rank's memory holds about 1/N of the weights. At one rank every slice
is the whole tensor and the forward passes are plain `F.linear` / `F.embedding`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from tandem.engine.models.prepacked import linear
from tandem.engine.models.tensor_parallel import TensorParallel


class WeightSource(Protocol):
    """A checkpoint tensor not read yet (safetensors' `PySafeSlice`)."""

    def get_shape(self) -> list[int]: ...

    def __getitem__(self, index: Any) -> torch.Tensor: ...


@dataclass(frozen=True)
class Shard:
    """Rows `start : start + size` of a checkpoint matrix with `full` rows, stacked into a
    fused parameter (q/k/v, gate/up) under `shard_id`."""

    shard_id: str | int
    size: int
    start: int
    full: int


def _check_shape(source: WeightSource, expected: Sequence[int]) -> None:
    shape = tuple(source.get_shape())
    if shape != tuple(expected):
        raise ValueError(f"shape {shape} != expected {tuple(expected)}")


def _set_loader(module: nn.Module, loader: Any, shard_ids: tuple | None = None) -> None:
    for param in module.parameters(recurse=False):
        param.weight_loader = loader  # type: ignore[attr-defined]
        if shard_ids is not None:
            param.shard_ids = shard_ids  # type: ignore[attr-defined]


class ColumnParallelLinear(nn.Module):
    """Output features split across ranks; several checkpoint matrices stacked on the output
    dim, this rank's rows of each. No communication: the output stays split."""

    def __init__(self, in_features: int, shards: Sequence[Shard], bias: bool) -> None:
        super().__init__()
        self.shards = {s.shard_id: s for s in shards}
        self.offsets: dict[str | int, int] = {}
        out = 0
        for s in shards:
            self.offsets[s.shard_id] = out
            out += s.size
        self.weight = nn.Parameter(torch.empty(out, in_features))  # [sum local rows, in]
        self.bias = nn.Parameter(torch.zeros(out)) if bias else None
        self.prepacked: torch.Tensor | None = None  # see `prepacked.prepack_linears`
        _set_loader(self, self._load_shard, tuple(self.shards))

    def _load_shard(self, param: nn.Parameter, source: WeightSource, shard_id: str | int) -> None:
        s = self.shards[shard_id]
        _check_shape(source, (s.full, *param.shape[1:]))
        target = param.data.narrow(0, self.offsets[shard_id], s.size)
        target.copy_(source[s.start : s.start + s.size])

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, in] -> [T, local out]
        return linear(x, self.weight, self.bias, self.prepacked)


class RowParallelLinear(nn.Module):
    """Input features split across ranks (this rank's columns); the partial products are
    summed over the ranks, then the (replicated) bias is added once."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool, tp: TensorParallel, start: int
    ) -> None:
        """`in_features`: the full input width; this rank holds columns from `start`."""
        super().__init__()
        self.tp = tp
        self.in_full, self.start = in_features, start
        local = in_features // tp.size
        self.weight = nn.Parameter(torch.empty(out_features, local))  # [out, in / N]
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self.prepacked: torch.Tensor | None = None
        _set_loader(self, self._load)

    def _load(self, param: nn.Parameter, source: WeightSource, shard_id: None) -> None:
        if param.dim() == 1:
            _check_shape(source, param.shape)
            param.data.copy_(source[:])
            return
        _check_shape(source, (param.shape[0], self.in_full))
        param.data.copy_(source[:, self.start : self.start + param.shape[1]])

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, in / N] -> [T, out]
        if self.tp.size == 1:
            return linear(x, self.weight, self.bias, self.prepacked)
        out = self.tp.all_reduce(linear(x, self.weight, None, self.prepacked))
        return out if self.bias is None else out + self.bias


class VocabParallelEmbedding(nn.Module):
    """Rows `vocab_start : vocab_start + vocab_per_rank` of the embedding (zero rows past the
    vocabulary); tokens outside the slice embed to zero here and the ranks' sum is the
    embedding. Also the LM head's weight when embeddings are tied."""

    def __init__(self, vocab_size: int, hidden_size: int, tp: TensorParallel) -> None:
        super().__init__()
        self.tp = tp
        self.vocab_size = vocab_size
        self.start = tp.shape.vocab_start
        self.weight = nn.Parameter(torch.zeros(tp.shape.vocab_per_rank, hidden_size))  # [Vp, H]
        _set_loader(self, self._load)

    def serve_as_lm_head(self) -> None:
        """Also the LM head (tied embeddings): gets a prepacked copy, keeps its weight."""
        self.prepacked: torch.Tensor | None = None
        self.keeps_weight = True

    def _load(self, param: nn.Parameter, source: WeightSource, shard_id: None) -> None:
        _check_shape(source, (self.vocab_size, param.shape[1]))
        stop = min(self.start + param.shape[0], self.vocab_size)
        param.data[: stop - self.start].copy_(source[self.start : stop])

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, H]
        if self.tp.size == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.start
        outside = (local < 0) | (local >= self.weight.shape[0])  # [T]
        hidden = F.embedding(local.masked_fill(outside, 0), self.weight)
        return self.tp.all_reduce(hidden.masked_fill_(outside[:, None], 0.0))


class ParallelLMHead(VocabParallelEmbedding):
    """The LM head's rows of this rank's vocabulary slice (see `vocab_logits`)."""

    def __init__(self, vocab_size: int, hidden_size: int, tp: TensorParallel) -> None:
        super().__init__(vocab_size, hidden_size, tp)
        self.prepacked: torch.Tensor | None = None


def vocab_logits(hidden: torch.Tensor, head: VocabParallelEmbedding) -> torch.Tensor | None:
    """[S, H] -> [S, V] float32 logits on rank 0 (each rank's slice, gathered), None on the
    other ranks."""
    local = linear(hidden, head.weight, None, getattr(head, "prepacked", None))  # [S, Vp]
    if head.tp.size == 1:
        return local.float()
    logits = head.tp.gather_last_dim(local)
    return None if logits is None else logits[:, : head.vocab_size].float()
