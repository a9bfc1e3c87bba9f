"""Attention kernel benchmark: decode bandwidth and prefill TFLOP/s, against torch's SDPA.

1. Decode: one query token per sequence over a paged context (Llama-3-8B heads: 32 query,
   8 KV, head size 128, bf16, blocks of 16 scattered over the pool), contexts 1k-32k and
   batches 1-256. Achieved bandwidth = bytes of K/V read (plus q and out) / time, against the
   device's nominal peak and a measured device copy. SDPA runs on the same K/V laid out
   contiguously (no paging), with GQA.
2. Prefill: one chunk of Q tokens, causal, over no cached prefix (SDPA comparable) and over
   a cached prefix (paged). TFLOP/s = 4 * Hq * D * visible (query, key) pairs / time.

    python -P bench/kernels.py                  # on a GPU
    TRITON_INTERPRET=1 python -P bench/kernels.py --smoke   # tiny shapes, any machine
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for tests.kernels

from device_timing import print_header, time_ms

from tandem.kernels.attention_plan import device_num_sms, plan_attention
from tandem.kernels.paged_attention import unified_attention
from tests.kernels.paged_batch import PagedBatch, paged_batch


@dataclass(frozen=True)
class Shape:
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    block_size: int = 16
    dtype: torch.dtype = torch.bfloat16


SMOKE = Shape(num_heads=4, num_kv_heads=2, head_dim=16, block_size=4, dtype=torch.float32)


def paged_inputs(
    shape: Shape, query_lens: list[int], context_lens: list[int], device: torch.device
) -> PagedBatch:
    """Blocks scattered over a pool exactly as large as the batch needs."""
    return paged_batch(
        query_lens,
        context_lens,
        shape.num_heads,
        shape.num_kv_heads,
        shape.head_dim,
        shape.block_size,
        dtype=shape.dtype,
        device=device,
        pool_factor=1,
    )


def attention_fn(x: PagedBatch, shape: Shape, num_sms: int | None):
    plan = plan_attention(
        x.query_start_loc_cpu,
        x.max_seq_len,
        shape.num_kv_heads,
        shape.num_heads // shape.num_kv_heads,
        x.query.device,
        num_sms=num_sms,
        dtype=shape.dtype,
    )
    out = torch.empty_like(x.query)
    scale = shape.head_dim**-0.5
    args = (x.query, x.kv_layer, x.block_tables, x.seq_lens, x.query_start_loc, plan, scale)
    return (lambda: unified_attention(*args, out=out)), plan


def bench_decode(shape: Shape, contexts, batches, device, peak: float | None, max_gib: float):
    num_sms = device_num_sms(device)
    elem = torch.empty((), dtype=shape.dtype).element_size()
    print("\n## decode attention (one query token per sequence)")
    print("| context | batch | splits | ours us | ours GB/s | % peak | SDPA us | SDPA GB/s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for context in contexts:
        for batch in batches:
            kv_bytes = batch * context * shape.num_kv_heads * shape.head_dim * 2 * elem
            if kv_bytes > max_gib * 2**30:
                print(f"| {context} | {batch} | - | skipped: {kv_bytes / 2**30:.0f} GiB of KV |")
                continue
            x = paged_inputs(shape, [1] * batch, [context - 1] * batch, device)
            fn, plan = attention_fn(x, shape, num_sms)
            ms = time_ms(fn, device)
            moved = kv_bytes + 2 * x.query.numel() * elem
            sdpa_ms = time_ms(_sdpa_decode(x, shape, context), device)
            del x
            pct = f"{100 * moved / (ms * 1e-3) / peak:.0f}%" if peak else "-"
            print(
                f"| {context} | {batch} | {plan.num_splits} | {ms * 1e3:.1f} | "
                f"{moved / (ms * 1e-3) / 1e9:.0f} | {pct} | {sdpa_ms * 1e3:.1f} | "
                f"{moved / (sdpa_ms * 1e-3) / 1e9:.0f} |"
            )


def _sdpa_decode(x: PagedBatch, shape: Shape, context: int):
    """The same K/V gathered into [B, Hkv, S, D] once (untimed); SDPA then reads it."""
    batch = x.block_tables.shape[0]
    k = x.kv_layer[x.block_tables.long(), 0].reshape(batch, -1, shape.num_kv_heads, shape.head_dim)
    v = x.kv_layer[x.block_tables.long(), 1].reshape(batch, -1, shape.num_kv_heads, shape.head_dim)
    k = k[:, :context].transpose(1, 2).contiguous()
    v = v[:, :context].transpose(1, 2).contiguous()
    q = x.query.view(batch, shape.num_heads, 1, shape.head_dim)
    return lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def bench_prefill(shape: Shape, chunks: list[tuple[int, int]], device):
    num_sms = device_num_sms(device)
    print("\n## prefill attention (one chunk, causal)")
    print("| chunk | cached prefix | ours ms | ours TFLOP/s | SDPA ms | SDPA TFLOP/s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for chunk, prefix in chunks:
        x = paged_inputs(shape, [chunk], [prefix], device)
        fn, _ = attention_fn(x, shape, num_sms)
        ms = time_ms(fn, device)
        pairs = chunk * prefix + chunk * (chunk + 1) / 2
        flops = 4 * shape.num_heads * shape.head_dim * pairs
        sdpa = "- | -"
        if prefix == 0:
            sdpa_ms = time_ms(_sdpa_prefill(x, shape, chunk), device)
            sdpa = f"{sdpa_ms:.3f} | {flops / (sdpa_ms * 1e-3) / 1e12:.1f}"
        print(f"| {chunk} | {prefix} | {ms:.3f} | {flops / (ms * 1e-3) / 1e12:.1f} | {sdpa} |")


def _sdpa_prefill(x: PagedBatch, shape: Shape, chunk: int):
    table = x.block_tables[0].long()
    k = x.kv_layer[table, 0].reshape(-1, shape.num_kv_heads, shape.head_dim)[:chunk]
    v = x.kv_layer[table, 1].reshape(-1, shape.num_kv_heads, shape.head_dim)[:chunk]
    q = x.query.transpose(0, 1)[None]  # [1, Hq, Q, D]
    k, v = k.transpose(0, 1)[None].contiguous(), v.transpose(0, 1)[None].contiguous()
    return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes (CPU interpreter)")
    parser.add_argument("--max-kv-gib", type=float, default=24.0)
    args = parser.parse_args()
    device, peak = print_header(args.smoke)
    if args.smoke:
        bench_decode(SMOKE, [64], [1, 2], device, peak, args.max_kv_gib)
        bench_prefill(SMOKE, [(16, 0), (8, 24)], device)
        return
    shape = Shape()
    contexts = [1024, 2048, 4096, 8192, 16384, 32768]
    bench_decode(shape, contexts, [1, 8, 32, 64, 128, 256], device, peak, args.max_kv_gib)
    bench_prefill(shape, [(1024, 0), (2048, 0), (4096, 0), (8192, 0), (2048, 6144)], device)


if __name__ == "__main__":
    main()
