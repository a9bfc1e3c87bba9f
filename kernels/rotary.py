"""Rotary embedding, neox style (the two halves of each head rotate together), applied to
the query and key heads of each token in place, at that token's own position.

Reference: `tandem.kernels.reference.rotary_ref`. Any rope scaling (llama3) is already in
the cos/sin table.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tandem.kernels.attention_plan import next_power_of_2
from tandem.kernels.launch_options import LAUNCH_OPTIONS


@triton.jit
def _rotary_kernel(
    positions_ptr,  # [T] int64
    q_ptr,  # [T, Hq, D], rotated in place
    k_ptr,  # [T, Hkv, D], rotated in place
    cos_sin_ptr,  # [max_pos, D] fp32: cos | sin
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_cs,
    num_heads,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)  # query heads first, then key heads
    pos = tl.load(positions_ptr + token)
    i = tl.arange(0, HALF_PAD)
    ok = i < HALF
    cos = tl.load(cos_sin_ptr + pos * stride_cs + i, mask=ok, other=0.0)
    sin = tl.load(cos_sin_ptr + pos * stride_cs + HALF + i, mask=ok, other=0.0)
    if head < num_heads:
        base = q_ptr + token * stride_qt + head * stride_qh
    else:
        base = k_ptr + token * stride_kt + (head - num_heads) * stride_kh
    x1 = tl.load(base + i, mask=ok, other=0.0)
    x2 = tl.load(base + HALF + i, mask=ok, other=0.0)
    y1 = x1.to(tl.float32) * cos - x2.to(tl.float32) * sin
    y2 = x2.to(tl.float32) * cos + x1.to(tl.float32) * sin
    tl.store(base + i, y1.to(x1.dtype), mask=ok)
    tl.store(base + HALF + i, y2.to(x1.dtype), mask=ok)


def rotary(
    positions: torch.Tensor,  # [T] int64
    query: torch.Tensor,  # [T, Hq, D], rotated in place
    key: torch.Tensor,  # [T, Hkv, D], rotated in place
    cos_sin_cache: torch.Tensor,  # [max_pos, D] fp32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotates `query` and `key` in place and returns them."""
    num_tokens, num_heads, head_dim = query.shape
    assert key.shape[0] == num_tokens and key.shape[2] == head_dim, (query.shape, key.shape)
    assert head_dim % 2 == 0 and cos_sin_cache.shape[1] == head_dim, cos_sin_cache.shape
    assert positions.shape == (num_tokens,), positions.shape
    assert query.stride(-1) == key.stride(-1) == cos_sin_cache.stride(-1) == 1
    assert cos_sin_cache.dtype == torch.float32, cos_sin_cache.dtype
    if num_tokens > 0:
        _rotary_kernel[(num_tokens, num_heads + key.shape[1])](
            positions, query, key, cos_sin_cache,
            query.stride(0), query.stride(1), key.stride(0), key.stride(1),
            cos_sin_cache.stride(0), num_heads,
            HALF=head_dim // 2,
            HALF_PAD=next_power_of_2(head_dim // 2),
            **LAUNCH_OPTIONS,
        )  # fmt: skip
    return query, key
