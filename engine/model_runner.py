"""The model runner: rank 0's side of one flat batch per step (its shard, the other ranks,
the sampler).

It receives each step as a plain-data `StepPlan` and keeps its own copy of every request it
runs (`RequestStates`): new requests in full, known ones by their diffs, dropped when the plan
says so. Each step is flattened from those copies into varlen tensors: `input_ids` and
`positions` [T], and the attention metadata (`query_start_loc`, `seq_lens`, `block_tables`,
`slot_mapping`). Only sequences whose computed tokens reach their end this step get logits
and a sampled token, which the runner appends to its own copy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from tandem.engine.attention.backend import AttentionBackend
from tandem.engine.core.config import EngineConfig
from tandem.engine.core.kv_cache_manager import KVCacheManager
from tandem.engine.core.request import TokenLogprobs
from tandem.engine.core.scheduler import ModelRunnerOutput
from tandem.engine.core.step_event import StepEvent
from tandem.engine.core.step_plan import StepPlan
from tandem.engine.exec.cuda_graphs import DecodeGraphs
from tandem.engine.exec.model_shard import (
    ModelShard,
    allocate_kv_cache,
    kv_block_bytes,
    select_attention_backend,
)
from tandem.engine.exec.request_state import RequestState, RequestStates
from tandem.engine.exec.sampler import GrammarRows, Sampler
from tandem.engine.exec.step_batch import StepBatch
from tandem.engine.exec.tier_copier import TierCopier
from tandem.engine.models.tensor_parallel import TensorParallel
from tandem.engine.parallel.rank_processes import RankProcesses

__all__ = [
    "ModelRunner",
    "activation_bytes",
    "allocate_kv_cache",
    "attach_tiers",
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


def attach_tiers(kv: KVCacheManager, runner: ModelRunner, config: EngineConfig) -> None:
    """Put the configured lower KV tiers under `kv`'s pool, copied by `runner`'s copier."""
    if runner.tier_copier is not None:
        cache = config.cache
        kv.attach_tiers(
            runner.tier_copier, cache.host_blocks, cache.disk_blocks, kv_block_bytes(config)
        )


class ModelRunner:
    """Rank 0's runner: applies each `StepPlan` to its request states, flattens the step into
    a `StepBatch`, has every rank run it, and samples from the gathered logits. Owns rank 0's
    `ModelShard`, the request states (`requests`) and, with tensor parallelism, the other
    ranks' processes (`close` stops them). Sees no `Request`: the scheduler applies the
    output to those."""

    def __init__(self, config: EngineConfig) -> None:
        """With `tensor_parallel_size` N > 1, spawns ranks 1..N-1 and returns once all are
        ready; raises `RankStartupError` naming a rank that died or failed (every rank
        stopped)."""
        self.config = config
        self.device = config.device
        self.block_size = config.cache.block_size
        self.requests = RequestStates(config.device)
        self.sampler = Sampler()
        self.workers: RankProcesses | None = None
        self.broken: str | None = None  # why the ranks were stopped mid-run
        self.tier_copier: TierCopier | None = None  # the lower KV tiers' copies (one rank)
        tp = TensorParallel(config.model, 0, config.tensor_parallel_size)
        if tp.size == 1:
            self.shard = ModelShard(config, tp)
            self.shard.capture_graphs()
            cache = config.cache
            if cache.host_blocks:
                self.tier_copier = TierCopier(
                    self.kv_cache, cache.host_blocks, cache.disk_blocks, cache.disk_dir
                )
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
        """Stop and join the other ranks (nothing at one rank) and the tier copier.
        Idempotent."""
        if self.tier_copier is not None:
            self.tier_copier.close()
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
    def execute(self, plan: StepPlan) -> ModelRunnerOutput:
        """Run one step: apply `plan` to the request states, run its batch on every rank, and
        sample the sequences that reach their end (each token appended to its request's
        state). The output is in the plan's batch order."""
        if self.broken is not None:
            raise RuntimeError(f"the tensor-parallel ranks were stopped: {self.broken}")
        batch, states = self._prepare(plan)
        if self.workers is None:
            hidden, logits = self.shard.forward(batch)  # [T, H], [S, V]
        else:
            hidden, logits = self._forward_all_ranks(batch)
        kv_written = StepEvent.record(hidden.device)
        num_seqs = plan.num_reqs
        sampled: list[int | None] = [None] * num_seqs
        logprobs: list[TokenLogprobs | None] = [None] * num_seqs
        if logits is not None:
            rows = batch.sample_rows
            due = [states[i] for i in rows]
            result = self.sampler(logits, due, _grammar_rows(plan, due))
            for row, state, token_id, lp in zip(rows, due, result.token_ids, result.logprobs):
                state.append_token(token_id)
                sampled[row] = token_id
                logprobs[row] = lp
        return ModelRunnerOutput(sampled, logprobs, kv_written)

    def _prepare(self, plan: StepPlan) -> tuple[StepBatch, list[RequestState]]:
        """Apply `plan` to the request states, then flatten its batch from them. Returns the
        batch and its states, in batch order."""
        states = self.requests.update(plan)
        num_sched = np.asarray(plan.num_scheduled_tokens, dtype=np.int32)  # [B]
        computed = np.fromiter((s.num_computed_tokens for s in states), np.int32, len(states))
        seq_lens = computed + num_sched  # [B]
        query_start_loc = np.zeros(len(states) + 1, dtype=np.int32)
        np.cumsum(num_sched, out=query_start_loc[1:])
        input_ids: list[int] = []
        sample_rows = []
        for i, (state, c, n) in enumerate(zip(states, computed.tolist(), num_sched.tolist())):
            if n == 1:
                input_ids.append(state.all_token_ids[c])
            else:
                input_ids.extend(state.all_token_ids[c : c + n])
            if c + n == state.num_tokens:
                sample_rows.append(i)
        block_tables = _pad_tables([s.block_ids for s in states])  # [B, MB]
        positions = np.repeat(computed - query_start_loc[:-1], num_sched) + np.arange(
            query_start_loc[-1], dtype=np.int32
        )  # [T]
        rows = np.repeat(np.arange(len(states)), num_sched)
        slots = block_tables[rows, positions // self.block_size].astype(np.int64)
        slots = slots * self.block_size + positions % self.block_size  # [T]
        batch = StepBatch(
            input_ids=np.array(input_ids, dtype=np.int64),
            positions=positions.astype(np.int64),
            query_start_loc=query_start_loc,
            seq_lens=seq_lens,
            block_tables=block_tables,
            slot_mapping=slots,
            sample_rows=sample_rows,
            logits_indices=(query_start_loc[1:][sample_rows] - 1).astype(np.int64),
        )
        return batch, states


def _grammar_rows(plan: StepPlan, states: Sequence[RequestState]) -> GrammarRows | None:
    """The plan's grammar bitmask, its request ids turned into rows of the sampled `states`."""
    bitmask = plan.grammar_bitmask
    if bitmask is None:
        return None
    row_of = {state.request_id: row for row, state in enumerate(states)}
    return GrammarRows([row_of[rid] for rid in bitmask.request_ids], bitmask.bits)


def _pad_tables(tables: list[list[int]]) -> np.ndarray:
    """Block tables as one [B, max_blocks] int32 array, padded with zeros."""
    width = max(len(t) for t in tables)
    out = np.zeros((len(tables), width), dtype=np.int32)
    for i, table in enumerate(tables):
        out[i, : len(table)] = table
    return out
