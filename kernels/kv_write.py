"""KV write: scatter a step's new keys and values into their cache slots.

Reference: `tandem.kernels.reference.write_kv_ref`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tandem.kernels.attention_plan import next_power_of_2
from tandem.kernels.launch_options import LAUNCH_OPTIONS


@triton.jit
def _write_kv_kernel(
    key_ptr,  # [T, Hkv, D]
    value_ptr,  # [T, Hkv, D]
    kv_ptr,  # [N, 2, bs, Hkv, D]
    slot_mapping_ptr,  # [T] int64
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kvn,
    stride_kvs,
    stride_kvt,
    stride_kvh,
    PAGE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    slot = tl.load(slot_mapping_ptr + token)
    if slot >= 0:  # negative slots are padding or tokens whose KV is already cached
        d = tl.arange(0, HEAD_DIM_PAD)
        d_ok = d < HEAD_DIM
        k = tl.load(key_ptr + token * stride_kt + head * stride_kh + d, mask=d_ok)
        v = tl.load(value_ptr + token * stride_vt + head * stride_vh + d, mask=d_ok)
        dst = (slot // PAGE) * stride_kvn + (slot % PAGE) * stride_kvt + head * stride_kvh + d
        tl.store(kv_ptr + dst, k.to(kv_ptr.dtype.element_ty), mask=d_ok)
        tl.store(kv_ptr + stride_kvs + dst, v.to(kv_ptr.dtype.element_ty), mask=d_ok)


def write_kv(
    key: torch.Tensor,  # [T, Hkv, D]
    value: torch.Tensor,  # [T, Hkv, D]
    kv_layer: torch.Tensor,  # [N, 2, bs, Hkv, D], written in place
    slot_mapping: torch.Tensor,  # [T] int64: block_id * bs + offset; negative = skip
) -> None:
    """Store token t's key and value at slot `slot_mapping[t]` of the layer's cache."""
    num_tokens, num_kv_heads, head_dim = key.shape
    assert value.shape == key.shape, (key.shape, value.shape)
    assert kv_layer.dim() == 5 and kv_layer.shape[1] == 2, kv_layer.shape
    assert kv_layer.shape[3:] == (num_kv_heads, head_dim), (kv_layer.shape, key.shape)
    assert key.stride(-1) == value.stride(-1) == kv_layer.stride(-1) == 1, "D must be contiguous"
    assert slot_mapping.shape == (num_tokens,) and slot_mapping.dtype == torch.int64
    assert key.device == kv_layer.device == slot_mapping.device, "tensors on different devices"
    if num_tokens == 0:
        return
    _write_kv_kernel[(num_tokens, num_kv_heads)](
        key, value, kv_layer, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        kv_layer.stride(0), kv_layer.stride(1), kv_layer.stride(2), kv_layer.stride(3),
        PAGE=kv_layer.shape[2],
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=next_power_of_2(head_dim),
        **LAUNCH_OPTIONS,
    )  # fmt: skip
