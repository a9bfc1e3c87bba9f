"""SiLU-and-multiply: the gated MLP's `silu(gate) * up` over the fused gate|up projection.

Reference: `tandem.kernels.reference.silu_and_mul_ref`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tandem.kernels.launch_options import LAUNCH_OPTIONS

_BLOCK = 1024


@triton.jit
def _silu_and_mul_kernel(
    x_ptr,  # [T, 2I]: gate | up
    out_ptr,  # [T, I]
    stride_x,
    stride_o,
    inner,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < inner
    gate = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + inner + cols, mask=ok, other=0.0).to(tl.float32)
    y = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + row * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=ok)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:  # [T, 2I] -> [T, I]
    """A new tensor; `x` is not written."""
    assert x.dim() == 2 and x.shape[1] % 2 == 0 and x.stride(1) == 1, (x.shape, x.stride())
    inner = x.shape[1] // 2
    out = x.new_empty((x.shape[0], inner))
    if x.shape[0] > 0:
        grid = (x.shape[0], triton.cdiv(inner, _BLOCK))
        _silu_and_mul_kernel[grid](
            x, out, x.stride(0), out.stride(0), inner, BLOCK=_BLOCK, **LAUNCH_OPTIONS
        )
    return out
