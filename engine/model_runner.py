"""The model runner: loads the model, owns the KV-cache tensor, runs one flat batch per step.

Each step is flattened into varlen tensors: `input_ids` and `positions` [T], and the
attention metadata (`query_start_loc`, `seq_lens`, `block_tables`, `slot_mapping`). Only
sequences whose computed tokens reach their end this step get logits and a sampled token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from tandem.engine.attention import AttentionBackend, AttentionBatch, CommonAttentionMetadata
from tandem.engine.config import EngineConfig
from tandem.engine.cuda_graphs import DecodeGraphs
from tandem.engine.host_memory import hugepage_zeros
from tandem.engine.loader import load_weights
from tandem.engine.models.registry import model_class
from tandem.engine.request import Request
from tandem.engine.sampler import Sampler
from tandem.engine.scheduler import ModelRunnerOutput, SchedulerOutput
from tandem.engine.step_event import StepEvent
from tandem.engine.torch_attention import TorchAttentionBackend
from tandem.kernels.attention_plan import device_num_sms
from tandem.kernels.ops import kernel_ops


def select_attention_backend(config: EngineConfig) -> AttentionBackend:
    """The plain-torch backend with the torch kernels; Triton's with the Triton kernels."""
    m = config.model
    if config.kernels == "torch":
        return TorchAttentionBackend(
            config.cache.block_size, sliding_window=m.sliding_window, dtype=config.dtype
        )
    from tandem.engine.triton_attention import TritonAttentionBackend

    return TritonAttentionBackend(
        m.num_kv_heads,
        m.num_heads // m.num_kv_heads,
        device_num_sms(config.device),
        sliding_window=m.sliding_window,
        dtype=config.dtype,
    )


def allocate_kv_cache(config: EngineConfig) -> torch.Tensor:
    """The block-major cache: [num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim]."""
    m = config.model
    shape = (
        config.cache.num_blocks,
        m.num_layers,
        2,
        config.cache.block_size,
        m.num_kv_heads,
        m.head_dim,
    )
    if config.cache.hugepages:
        return hugepage_zeros(shape, config.dtype)
    return torch.zeros(shape, dtype=config.dtype, device=config.device)


def kv_block_bytes(config: EngineConfig) -> int:
    """Bytes of one KV block (every layer's K and V for `block_size` tokens)."""
    m = config.model
    elem = torch.empty((), dtype=config.dtype).element_size()
    return m.num_layers * 2 * config.cache.block_size * m.num_kv_heads * m.head_dim * elem


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
    """Owns the model weights and the KV cache; reads the scheduled requests' token ids and
    block ids, never mutates the requests (the scheduler applies the output)."""

    def __init__(self, config: EngineConfig, block_ids_of: Callable[[str], list[int]]) -> None:
        """`block_ids_of(request_id) -> list[int]` reads a request's block table."""
        self.config = config
        self.device = config.device
        self.block_size = config.cache.block_size
        self.block_ids_of = block_ids_of
        ops = kernel_ops(config.kernels)
        with torch.device(config.device):
            self.model = model_class(config.model)(config.model, ops).to(config.dtype)
        load_weights(self.model, config.model_dir)
        self.model.eval()
        self.kv_cache = allocate_kv_cache(config)
        self.backend = select_attention_backend(config)
        self.sampler = Sampler()
        self.graphs = self._decode_graphs() if config.cuda_graphs else None

    def _decode_graphs(self) -> DecodeGraphs:
        c = self.config
        graphs = DecodeGraphs(
            self._forward,
            self.backend,
            c.scheduler.max_num_seqs,
            -(-c.scheduler.max_model_len // self.block_size) + 1,  # + the next step's block
            c.scheduler.max_model_len,
            self.device,
        )
        with torch.inference_mode():
            graphs.capture()
        return graphs

    def _forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBatch
    ) -> torch.Tensor:  # [T] ids, [T] positions -> [T, H]
        return self.model(input_ids, positions, self.kv_cache, attn)

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        input_ids, positions, common, sample_rows = self._prepare(out)
        if self.graphs is not None and self.graphs.can_run(common):
            hidden = self.graphs.run(input_ids, positions, common)  # [T, H]
        else:
            attn = AttentionBatch(self.backend, self.backend.build(common))
            hidden = self._forward(input_ids, positions, attn)  # [T, H]
        kv_written = StepEvent.record(hidden.device)
        num_seqs = len(out.scheduled)
        sampled: list[int | None] = [None] * num_seqs
        logprobs: list = [None] * num_seqs
        if sample_rows:
            last_token = torch.from_numpy(common.query_start_loc_cpu[1:][sample_rows] - 1)
            logits = self.model.compute_logits(hidden[last_token.to(self.device)])  # [S, V]
            result = self.sampler(logits, [out.scheduled[i] for i in sample_rows])
            for row, token_id, lp in zip(sample_rows, result.token_ids, result.logprobs):
                sampled[row] = token_id
                logprobs[row] = lp
        return ModelRunnerOutput(sampled, logprobs, kv_written)

    def _prepare(
        self, out: SchedulerOutput
    ) -> tuple[torch.Tensor, torch.Tensor, CommonAttentionMetadata, list[int]]:
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
        common = CommonAttentionMetadata.from_host(
            query_start_loc, seq_lens, block_tables, slots, self.device
        )
        ids = torch.tensor(input_ids, dtype=torch.long, device=self.device)
        pos = torch.from_numpy(positions.astype(np.int64)).to(self.device)
        return ids, pos, common, sample_rows


def _pad_tables(tables: list[list[int]]) -> np.ndarray:
    """Block tables as one [B, max_blocks] int32 array, padded with zeros."""
    width = max(len(t) for t in tables)
    out = np.zeros((len(tables), width), dtype=np.int32)
    for i, table in enumerate(tables):
        out[i, : len(table)] = table
    return out
