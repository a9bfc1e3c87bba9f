"""What each Triton kernel costs a CUDA GPU, found without one: registers, spills, shared
memory and resident blocks per multiprocessor, kernel by kernel at the shapes the engine
launches them with.

Every launcher runs on CPU tensors inside `tandem.kernels.cross_compile`, which compiles the
kernel for real for `sm_<arch>` (PTX, then ptxas to a cubin) and launches nothing. Shapes
are Llama-3-8B's (32 query heads, 8 KV heads, head size 128, hidden 4096, intermediate
14336, bf16, blocks of 16 tokens) unless the case says otherwise.

    python -P bench/kernel_resources.py [--arch 90 80] [--json FILE]

TRITON_INTERPRET must be unset: interpreted kernels are not compiled.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch
import triton

from tandem.kernels.activation import silu_and_mul
from tandem.kernels.attention_plan import plan_attention
from tandem.kernels.cross_compile import CUDA_ARCHS, KernelBuild, cross_compile
from tandem.kernels.kv_write import write_kv
from tandem.kernels.paged_attention import unified_attention
from tandem.kernels.rms_norm import rms_norm
from tandem.kernels.rotary import rotary

BF16 = torch.bfloat16
NUM_LAYERS = 32  # the cache's layer stride: each layer is a view of the block-major tensor


@dataclass(frozen=True)
class Heads:
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    dtype: torch.dtype = BF16
    block_size: int = 16


def layer_cache(h: Heads) -> torch.Tensor:  # [N, 2, bs, Hkv, D], strided as the engine's
    """Layer 0 of a small block-major cache [N, L, 2, bs, Hkv, D]: the kernels see the real
    strides; no block is read, since nothing runs."""
    cache = torch.empty(4, NUM_LAYERS, 2, h.block_size, h.num_kv_heads, h.head_dim, dtype=h.dtype)
    return cache[:, 0]


def attention_case(
    heads: Heads,
    query_lens: list[int],
    context_lens: list[int],
    *,
    sliding_window: int = 0,
    softcap: float = 0.0,
) -> Callable[[int], None]:
    """One unified-attention launch over sequences with these new and cached tokens."""

    def launch(num_sms: int) -> None:
        h = heads
        seq_lens = np.add(query_lens, context_lens)
        qsl = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
        max_blocks = -(-int(seq_lens.max()) // h.block_size)
        query = torch.empty(int(qsl[-1]), h.num_heads, h.head_dim, dtype=h.dtype)
        group = h.num_heads // h.num_kv_heads
        plan = plan_attention(
            qsl,
            int(seq_lens.max()),
            h.num_kv_heads,
            group,
            query.device,
            num_sms=num_sms,
            dtype=h.dtype,
        )
        unified_attention(
            query,
            layer_cache(h),
            torch.zeros(len(query_lens), max_blocks, dtype=torch.int32),
            torch.from_numpy(seq_lens.astype(np.int32)),
            torch.from_numpy(qsl),
            plan,
            h.head_dim**-0.5,
            sliding_window=sliding_window,
            softcap=softcap,
        )

    return launch


def kv_write_case(heads: Heads, num_tokens: int) -> Callable[[int], None]:
    def launch(num_sms: int) -> None:
        h = heads
        kv = torch.empty(num_tokens, 2, h.num_kv_heads, h.head_dim, dtype=h.dtype)
        write_kv(kv[:, 0], kv[:, 1], layer_cache(h), torch.zeros(num_tokens, dtype=torch.int64))

    return launch


def rms_norm_case(num_tokens: int, hidden: int, residual: bool) -> Callable[[int], None]:
    def launch(num_sms: int) -> None:
        x = torch.empty(num_tokens, hidden, dtype=BF16)
        rms_norm(
            x, torch.empty(hidden, dtype=BF16), 1e-5, torch.empty_like(x) if residual else None
        )

    return launch


def rotary_case(heads: Heads, num_tokens: int) -> Callable[[int], None]:
    def launch(num_sms: int) -> None:
        h = heads
        q_size, kv_size = h.num_heads * h.head_dim, h.num_kv_heads * h.head_dim
        qkv = torch.empty(num_tokens, q_size + 2 * kv_size, dtype=h.dtype)  # as the model's
        q = qkv[:, :q_size].view(num_tokens, h.num_heads, h.head_dim)
        k = qkv[:, q_size : q_size + kv_size].view(num_tokens, h.num_kv_heads, h.head_dim)
        positions = torch.zeros(num_tokens, dtype=torch.int64)
        rotary(positions, q, k, torch.empty(8192, h.head_dim))

    return launch


def silu_case(num_tokens: int, intermediate: int) -> Callable[[int], None]:
    def launch(num_sms: int) -> None:
        silu_and_mul(torch.empty(num_tokens, 2 * intermediate, dtype=BF16))

    return launch


LLAMA_8B = Heads()
CASES: list[tuple[str, Callable[[int], None]]] = [
    ("attention: decode, 64 seqs at 2k", attention_case(LLAMA_8B, [1] * 64, [2047] * 64)),
    ("attention: decode, 1 seq at 32k (split-KV)", attention_case(LLAMA_8B, [1], [32767])),
    ("attention: prefill, 512 after 1k cached", attention_case(LLAMA_8B, [512], [1024])),
    (
        "attention: mixed, 256-token chunk + 32 decodes",
        attention_case(LLAMA_8B, [256] + [1] * 32, [0] + [1000] * 32),
    ),
    ("attention: decode, fp16", attention_case(Heads(dtype=torch.float16), [1] * 64, [2047] * 64)),
    (
        "attention: prefill, fp32 (IEEE dot)",
        attention_case(Heads(dtype=torch.float32), [512], [1024]),
    ),
    (
        "attention: decode, head 64 (Llama-3.2-1B)",
        attention_case(Heads(32, 8, 64), [1] * 64, [2047] * 64),
    ),
    (
        "attention: prefill, head 96, no GQA (Phi-3)",
        attention_case(Heads(32, 32, 96), [512], [1024]),
    ),
    (
        "attention: prefill, window 4096 + softcap 50",
        attention_case(LLAMA_8B, [512], [8192], sliding_window=4096, softcap=50.0),
    ),
    ("kv write: 2048 tokens", kv_write_case(LLAMA_8B, 2048)),
    ("rms norm: 64 x 4096", rms_norm_case(64, 4096, residual=False)),
    ("rms norm + residual: 2048 x 4096", rms_norm_case(2048, 4096, residual=True)),
    ("rotary: 2048 tokens", rotary_case(LLAMA_8B, 2048)),
    ("silu and mul: 2048 x 14336", silu_case(2048, 14336)),
]


def compile_all(arch: int) -> list[tuple[str, KernelBuild]]:
    """(case, build) for every launch of every case, compiled for `sm_<arch>`."""
    rows = []
    for case, launch in CASES:
        with cross_compile(arch) as builds:
            launch(CUDA_ARCHS[arch].num_sms)
        rows += [(case, build) for build in builds]
    return rows


def print_table(arch: int, rows: list[tuple[str, KernelBuild]]) -> None:
    a = CUDA_ARCHS[arch]
    print(
        f"\n## sm_{arch} ({a.name}): {a.num_sms} SMs, "
        f"{a.shared_per_block // 1024} KiB shared memory per block"
    )
    print(
        "| case | kernel | grid | warps | stages | registers | spilled B | shared KiB | blocks/SM |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for case, b in rows:
        grid = "x".join(map(str, b.grid))
        print(
            f"| {case} | {b.name.lstrip('_')} | {grid} | {b.num_warps} | {b.num_stages} | "
            f"{b.registers} | {b.stack_bytes + b.local_bytes} | {b.shared_bytes / 1024:.1f} | "
            f"{b.blocks_per_sm()} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, nargs="+", default=[90], choices=sorted(CUDA_ARCHS))
    parser.add_argument("--json", help="also write every build here, for tests")
    args = parser.parse_args()
    print(f"command: python {' '.join(sys.argv)}")
    print(
        f"machine: {platform.node()} {platform.machine()}, no GPU needed; "
        f"triton {triton.__version__}, torch {torch.__version__}"
    )
    records = []
    for arch in args.arch:
        start = time.perf_counter()
        rows = compile_all(arch)
        print_table(arch, rows)
        print(f"\n{len(rows)} launches compiled in {time.perf_counter() - start:.1f} s")
        records += [{"case": case, **asdict(b), "max_threads": b.max_threads} for case, b in rows]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
