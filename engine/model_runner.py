"""The model runner: rank 0's side of one flat batch per step (its shard, the other ranks,
the sampler).

Each step is flattened into varlen tensors: `input_ids` and `positions` [T], and the
attention metadata (`query_start_loc`, `seq_lens`, `block_tables`, `slot_mapping`). Only
sequences whose computed tokens reach their end this step get logits and a sampled token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from tandem.engine.attention.backend import AttentionBackend
from tandem.engine.core.config import EngineConfig
from tandem.engine.core.request import Request
from tandem.engine.core.scheduler import ModelRunnerOutput, SchedulerOutput
from tandem.engine.core.step_event import StepEvent
from tandem.engine.exec.cuda_graphs import DecodeGraphs
from tandem.engine.exec.model_shard import (
    ModelShard,
    allocate_kv_cache,
    kv_block_bytes,
    select_attention_backend,
)
from tandem.engine.exec.sampler import Sampler
from tandem.engine.exec.step_batch import StepBatch
from tandem.engine.models.tensor_parallel import TensorParallel
from tandem.engine.parallel.rank_processes import RankProcesses

__all__ = [
    "ModelRunner",
    "activation_bytes",
    "allocate_kv_cache",
    "kv_block_bytes",
    "select_attention_backend",
]


def activation_bytes(config: EngineConfig) -> int:
    """A bound on one step's transient memory: the largest layer's activations for a full
    token budget (twice, input and output alive together) plus float32 logits, log-probs
    and probabilities for every sequence."""
    m = config.model
    elem = torch.empty((), dtype=config.dtype).element_size()
    per_token = (m.num_heads + 2 * m.num_kv_heads) * m.head_dim + 2 * m.intermediate_size
    per_token += 2 * m.hidden_size
    tokens = config.scheduler.max_num_batched_tokens
    logits = config.scheduler.max_num_seqs * m.vocab_size * 4 * 3
    return 2 * tokens * per_token * elem + logits


class ModelRunner:
    """Rank 0's runner: flattens each step into a `StepBatch`, has every rank run it, and
    samples from the gathered logits. Owns rank 0's `ModelShard` and, with tensor
    parallelism, the other ranks' processes (`close` stops them). Reads the scheduled
    requests' token ids and block ids, never mutates the requests (the scheduler applies
    the output)."""

    def __init__(self, config: EngineConfig, block_ids_of: Callable[[str], list[int]]) -> None:
        """`block_ids_of(request_id) -> list[int]` reads a request's block table. With
        `tensor_parallel_size` N > 1, spawns ranks 1..N-1 and returns once all are ready;
        raises `RankStartupError` naming a rank that died or failed (every rank stopped)."""
        self.config = config
        self.device = config.device
        self.block_size = config.cache.block_size
        self.block_ids_of = block_ids_of
        self.sampler = Sampler()
        self.workers: RankProcesses | None = None
        self.broken: str | None = None  # why the ranks were stopped mid-run
        tp = TensorParallel(config.model, 0, config.tensor_parallel_size)
        if tp.size == 1:
            self.shard = ModelShard(config, tp)
            self.shard.capture_graphs()
            return
        threads = max(1, torch.get_num_threads() // tp.size) if self.device.type == "cpu" else 1
        self.workers = RankProcesses(config, threads)
        try:
            if self.device.type == "cpu":
                torch.set_num_threads(threads)
            self.shard = ModelShard(config, tp)
            self.workers.wait_loaded()
            self.workers.connect(tp, self.device)
            self.shard.capture_graphs()
            self.workers.wait_ready()
        except BaseException:
            self.workers.kill()
            self.workers = None
            raise

    @property
    def model(self) -> torch.nn.Module:
        return self.shard.model

    @property
    def kv_cache(self) -> torch.Tensor:
        """Rank 0's KV cache: [num_blocks, num_layers, 2, block_size, its KV heads, D]."""
        return self.shard.kv_cache

    @property
    def backend(self) -> AttentionBackend:
        return self.shard.backend

    @property
    def graphs(self) -> DecodeGraphs | None:
        return self.shard.graphs

    def close(self) -> None:
        """Stop and join the other ranks (nothing at one rank). Idempotent."""
        if self.workers is not None:
            self.workers.close()
            self.workers = None
            self.shard.tp.group = None

    def _forward_all_ranks(self, batch: StepBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Every rank runs `batch`. A step that fails on rank 0 after the others started it
        leaves them inside its collectives, out of step for good: the ranks are stopped and
        this runner refuses further steps."""
        try:
            self.workers.broadcast(batch)
            return self.shard.forward(batch)
        except BaseException as exc:
            self.broken = f"a step failed on rank 0 ({type(exc).__name__}: {exc})"
            self.close()
            raise

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        if self.broken is not None:
            raise RuntimeError(f"the tensor-parallel ranks were stopped: {self.broken}")
        batch = self._prepare(out)
        if self.workers is None:
            hidden, logits = self.shard.forward(batch)  # [T, H], [S, V]
        else:
            hidden, logits = self._forward_all_ranks(batch)
        kv_written = StepEvent.record(hidden.device)
        num_seqs = len(out.scheduled)
        sampled: list[int | None] = [None] * num_seqs
        logprobs: list = [None] * num_seqs
        if logits is not None:
            sample_rows = batch.sample_rows
            result = self.sampler(logits, [out.scheduled[i] for i in sample_rows])
            for row, token_id, lp in zip(sample_rows, result.token_ids, result.logprobs):
                sampled[row] = token_id
                logprobs[row] = lp
        return ModelRunnerOutput(sampled, logprobs, kv_written)

    def _prepare(self, out: SchedulerOutput) -> StepBatch:
        requests: Sequence[Request] = out.scheduled
        num_sched = np.asarray(out.num_scheduled_tokens, dtype=np.int32)  # [B]
        computed = np.fromiter((r.num_computed_tokens for r in requests), np.int32, len(requests))
        seq_lens = computed + num_sched  # [B]
        query_start_loc = np.zeros(len(requests) + 1, dtype=np.int32)
        np.cumsum(num_sched, out=query_start_loc[1:])
        input_ids: list[int] = []
        tables = [self.block_ids_of(r.request_id) for r in requests]
        sample_rows = []
        for i, (request, c, n) in enumerate(zip(requests, computed.tolist(), num_sched.tolist())):
            if n == 1:
                input_ids.append(request.all_token_ids[c])
            else:
                input_ids.extend(request.all_token_ids[c : c + n])
            if c + n == request.num_tokens:
                sample_rows.append(i)
        block_tables = _pad_tables(tables)  # [B, MB]
        positions = np.repeat(computed - query_start_loc[:-1], num_sched) + np.arange(
            query_start_loc[-1], dtype=np.int32
        )  # [T]
        rows = np.repeat(np.arange(len(requests)), num_sched)
        slots = block_tables[rows, positions // self.block_size].astype(np.int64)
        slots = slots * self.block_size + positions % self.block_size  # [T]
        return StepBatch(
            input_ids=np.array(input_ids, dtype=np.int64),
            positions=positions.astype(np.int64),
            query_start_loc=query_start_loc,
            seq_lens=seq_lens,
            block_tables=block_tables,
            slot_mapping=slots,
            sample_rows=sample_rows,
            logits_indices=(query_start_loc[1:][sample_rows] - 1).astype(np.int64),
        )


def _pad_tables(tables: list[list[int]]) -> np.ndarray:
    """Block tables as one [B, max_blocks] int32 array, padded with zeros."""
    width = max(len(t) for t in tables)
    out = np.zeros((len(tables), width), dtype=np.int32)
    for i, table in enumerate(tables):
        out[i, : len(table)] = table
    return out
