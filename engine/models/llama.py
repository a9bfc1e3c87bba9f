"""The Llama family (Llama, Mistral, Qwen2, Qwen3) over a paged KV cache.

One model covers the four: Qwen2 adds a q/k/v bias, Qwen3 an RMSNorm on q and k per head.
Parameter names follow Hugging Face, with q/k/v fused into `qkv_proj` and gate/up into
`gate_up_proj`; `packed_modules` tells the loader how checkpoint names map onto them.
With tensor parallelism (`tp`) every rank builds the same model over its share: its heads
(q/k/v column-parallel, o row-parallel), its MLP features (gate/up column-, down
row-parallel) and its vocabulary slice (embedding and LM head).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from tandem.engine.attention.backend import AttentionBatch
from tandem.engine.core.config import ModelConfig
from tandem.engine.models.layers import RMSNorm, RotaryEmbedding
from tandem.engine.models.parallel_layers import (
    ColumnParallelLinear,
    ParallelLMHead,
    RowParallelLinear,
    Shard,
    VocabParallelEmbedding,
    vocab_logits,
)
from tandem.engine.models.tensor_parallel import TensorParallel
from tandem.kernels.ops import TORCH_OPS, KernelOps


class LlamaAttention(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        ops: KernelOps,
        tp: TensorParallel,
        rotary_emb: RotaryEmbedding,
    ) -> None:
        """`rotary_emb`: the model's one table, shared by every layer."""
        super().__init__()
        shape, d = tp.shape, config.head_dim
        self.num_heads = shape.num_heads
        self.num_kv_heads = shape.num_kv_heads
        self.head_dim = d
        self.q_size = self.num_heads * d
        self.kv_size = self.num_kv_heads * d
        self.scale = d**-0.5
        q_full, kv_full = config.num_heads * d, config.num_kv_heads * d
        self.qkv_proj = ColumnParallelLinear(
            config.hidden_size,
            [
                Shard("q", self.q_size, shape.head_start * d, q_full),
                Shard("k", self.kv_size, shape.kv_head_start * d, kv_full),
                Shard("v", self.kv_size, shape.kv_head_start * d, kv_full),
            ],
            bias=config.qkv_bias,
        )
        self.o_proj = RowParallelLinear(
            q_full, config.hidden_size, config.o_bias, tp, shape.head_start * d
        )
        self.qk_norm = config.qk_norm
        if config.qk_norm:
            self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps, ops)
            self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps, ops)
        self.rotary_emb = rotary_emb

    def forward(
        self,
        rotation: object,  # the step's `RotaryEmbedding.prepare`
        hidden: torch.Tensor,  # [T, H]
        kv_layer: torch.Tensor,  # [N, 2, bs, Hkv, D]
        attn: AttentionBatch,
    ) -> torch.Tensor:  # [T, H]
        num_tokens = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, _ = self.q_norm(q)
            k, _ = self.k_norm(k)
        q, k = self.rotary_emb(rotation, q, k)
        out = attn.backend.forward(q, k, v, kv_layer, attn.metadata, self.scale)
        return self.o_proj(out.view(num_tokens, self.q_size))


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelConfig, ops: KernelOps, tp: TensorParallel) -> None:
        super().__init__()
        self.ops = ops
        full, size = config.intermediate_size, tp.shape.intermediate_size
        start = tp.shape.intermediate_start
        self.gate_up_proj = ColumnParallelLinear(
            config.hidden_size, [Shard(0, size, start, full), Shard(1, size, start, full)], False
        )
        self.down_proj = RowParallelLinear(full, config.hidden_size, False, tp, start)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, H] -> [T, H]
        return self.down_proj(self.ops.silu_and_mul(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        ops: KernelOps,
        tp: TensorParallel,
        rotary_emb: RotaryEmbedding,
    ) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, ops, tp, rotary_emb)
        self.mlp = LlamaMLP(config, ops, tp)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)

    def forward(
        self,
        rotation: object,  # the step's `RotaryEmbedding.prepare`
        hidden: torch.Tensor,  # [T, H]
        residual: torch.Tensor | None,  # [T, H]
        kv_layer: torch.Tensor,
        attn: AttentionBatch,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden
            hidden, _ = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(rotation, hidden, kv_layer, attn)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig, ops: KernelOps, tp: TensorParallel) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, tp)
        # one cos|sin table for every layer (a copy per layer would be 30 x 2 MiB at 8k)
        self.rotary_emb = RotaryEmbedding(
            config.head_dim,
            config.max_position_embeddings,
            config.rope_theta,
            config.rope_scaling,
            ops,
        )
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, ops, tp, self.rotary_emb) for _ in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)

    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        kv_cache: torch.Tensor,  # [N, L, 2, bs, Hkv, D]
        attn: AttentionBatch,
    ) -> torch.Tensor:  # [T, H]
        hidden = self.embed_tokens(input_ids)
        rotation = self.rotary_emb.prepare(positions)
        residual = None
        for i, layer in enumerate(self.layers):
            hidden, residual = layer(rotation, hidden, residual, kv_cache[:, i], attn)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM(nn.Module):
    # checkpoint name fragment -> (our fused parameter fragment, shard id)
    packed_modules: ClassVar[dict[str, tuple[str, str | int]]] = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }
    # checkpoint tensors that carry nothing we need
    ignored_suffixes: ClassVar[tuple[str, ...]] = ("rotary_emb.inv_freq",)

    def __init__(
        self, config: ModelConfig, ops: KernelOps = TORCH_OPS, tp: TensorParallel | None = None
    ) -> None:
        """`ops`: the norm, rotary and activation kernels (references or Triton); `tp`: this
        rank's share (None: the whole model on one rank)."""
        super().__init__()
        self.config = config
        tp = tp or TensorParallel(config)
        self.model = LlamaModel(config, ops, tp)
        if config.tie_word_embeddings:
            self.lm_head = None
            self.model.embed_tokens.serve_as_lm_head()
        else:
            self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, tp)

    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        kv_cache: torch.Tensor,  # [N, L, 2, bs, Hkv, D]
        attn: AttentionBatch,
    ) -> torch.Tensor:  # [T, H]
        return self.model(input_ids, positions, kv_cache, attn)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """[S, H] -> [S, V] float32 on rank 0; None on the other ranks."""
        head = self.model.embed_tokens if self.lm_head is None else self.lm_head
        return vocab_logits(hidden, head)
