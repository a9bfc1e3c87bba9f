"""One decode step of a random-weight model shaped like Llama-3-8B, in bf16, against the
memory-bandwidth bound.

Weights are made on the GPU (no download). Every sequence has 2k tokens of context in a
paged cache with scattered blocks; a step computes one token per sequence and its logits.
The bound is the bytes a step must read (every weight but the embedding table, which is
only gathered, plus the K/V of every running sequence) over the device's nominal bandwidth.
Timed both eagerly and through the engine's CUDA-graph decode buckets.

    python -P bench/decode_step.py                 # on a GPU
    TRITON_INTERPRET=1 python -P bench/decode_step.py --smoke   # tiny, any machine
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from device_timing import print_header, time_ms

from tandem.engine.attention.backend import AttentionBatch, CommonAttentionMetadata
from tandem.engine.attention.triton_backend import TritonAttentionBackend
from tandem.engine.core.config import ModelConfig
from tandem.engine.exec.cuda_graphs import DecodeGraphs
from tandem.engine.models.llama import LlamaForCausalLM
from tandem.kernels.attention_plan import device_num_sms
from tandem.kernels.ops import triton_ops

LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "max_position_embeddings": 8192,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
}
TINY = {
    **LLAMA3_8B,
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}
BLOCK_SIZE = 16


class DecodeBench:
    """A model, a paged cache and one decode step's inputs for `batch` sequences."""

    def __init__(self, raw: dict, batch: int, context: int, device, dtype) -> None:
        self.config = ModelConfig.from_dict(raw)
        m = self.config
        with torch.device(device):
            self.model = LlamaForCausalLM(m, triton_ops()).to(dtype).eval()
        blocks_per_seq = -(-context // BLOCK_SIZE)
        shape = (batch * blocks_per_seq, m.num_layers, 2, BLOCK_SIZE, m.num_kv_heads, m.head_dim)
        self.kv_cache = torch.randn(shape, dtype=dtype, device=device)
        tables = np.random.default_rng(0).permutation(batch * blocks_per_seq).astype(np.int32)
        tables = tables.reshape(batch, blocks_per_seq)
        seq_lens = np.full(batch, context, dtype=np.int32)
        qsl = np.arange(batch + 1, dtype=np.int32)
        pos = context - 1
        slots = tables[:, pos // BLOCK_SIZE].astype(np.int64) * BLOCK_SIZE + pos % BLOCK_SIZE
        self.common = CommonAttentionMetadata.from_host(qsl, seq_lens, tables, slots, device)
        self.input_ids = torch.randint(0, m.vocab_size, (batch,), device=device)
        self.positions = torch.full((batch,), pos, dtype=torch.long, device=device)
        self.backend = TritonAttentionBackend(
            m.num_kv_heads, m.num_heads // m.num_kv_heads, device_num_sms(device)
        )
        self.graphs = DecodeGraphs(
            self._forward, self.backend, batch, blocks_per_seq, context, torch.device(device)
        )

    def _forward(self, input_ids, positions, attn: AttentionBatch) -> torch.Tensor:
        return self.model(input_ids, positions, self.kv_cache, attn)

    def eager_step(self) -> torch.Tensor:  # [B, V] logits
        attn = AttentionBatch(self.backend, self.backend.build(self.common))
        return self.model.compute_logits(self._forward(self.input_ids, self.positions, attn))

    def graph_step(self) -> torch.Tensor:  # [B, V] logits
        hidden = self.graphs.run(self.input_ids, self.positions, self.common)
        return self.model.compute_logits(hidden)

    def bytes_read(self, batch: int, context: int) -> int:
        m = self.config
        elem = self.kv_cache.element_size()
        weights = sum(p.numel() for p in self.model.parameters()) * elem
        weights -= m.vocab_size * m.hidden_size * elem  # the embedding table is gathered
        if m.tie_word_embeddings:
            weights += m.vocab_size * m.hidden_size * elem  # but read whole as the LM head
        kv = batch * context * m.num_layers * 2 * m.num_kv_heads * m.head_dim * elem
        return weights + kv


def run(raw: dict, batches: list[int], context: int, device, dtype, peak) -> None:
    print("| batch | context | eager ms | graph ms | bound ms | graph % of bound |")
    print("| --- | --- | --- | --- | --- | --- |")
    for batch in batches:
        bench = DecodeBench(raw, batch, context, device, dtype)
        with torch.inference_mode():
            eager = time_ms(bench.eager_step, device, repeat=10, capture=False)
            bench.graphs.capture()
            graph = time_ms(bench.graph_step, device, repeat=10, capture=False)
        bound = "-"
        pct = "-"
        if peak:
            bound_ms = bench.bytes_read(batch, context) / peak * 1e3
            bound, pct = f"{bound_ms:.2f}", f"{100 * bound_ms / graph:.0f}%"
        print(f"| {batch} | {context} | {eager:.2f} | {graph:.2f} | {bound} | {pct} |")
        del bench
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny model (CPU interpreter)")
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--batches", default="1,8,64")
    args = parser.parse_args()
    torch.manual_seed(0)
    device, peak = print_header(args.smoke)
    if args.smoke:
        run(TINY, [1, 3], 40, device, torch.float32, peak)
        return
    batches = [int(b) for b in args.batches.split(",")]
    print(f"model: Llama-3-8B shape, random bf16 weights; context {args.context}")
    run(LLAMA3_8B, batches, args.context, device, torch.bfloat16, peak)


if __name__ == "__main__":
    main()
