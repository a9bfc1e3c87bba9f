"""RMSNorm with the residual add fused: one read of x (and the residual), one write of each.

Reference: `tandem.kernels.reference.rms_norm_ref`, whose rounding this follows: the sum is
rounded to the activation dtype before it is normalised, and the normalised row is rounded
before the weight multiplies it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tandem.kernels.attention_plan import next_power_of_2
from tandem.kernels.launch_options import LAUNCH_OPTIONS


@triton.jit
def _rms_norm_kernel(
    x_ptr,  # [T, H]
    residual_ptr,  # [T, H] (read when HAS_RESIDUAL)
    weight_ptr,  # [H]
    out_ptr,  # [T, H]
    residual_out_ptr,  # [T, H]: x + residual (written when HAS_RESIDUAL)
    stride_x,
    stride_r,
    stride_o,
    stride_ro,
    hidden_size,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_H)
    ok = cols < hidden_size
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + cols, mask=ok, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(residual_out_ptr + row * stride_ro + cols, x, mask=ok)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, 0) / hidden_size + eps)
    w = tl.load(weight_ptr + cols, mask=ok, other=0.0)
    y = (xf * rstd).to(x.dtype).to(tl.float32) * w.to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=ok)


def rms_norm(
    x: torch.Tensor,  # [..., H]
    weight: torch.Tensor,  # [H]
    eps: float,
    residual: torch.Tensor | None = None,  # [..., H]
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(norm(x + residual) * weight, x + residual); without `residual`, (norm(x) * weight,
    None). New tensors; the inputs are not written."""
    shape, hidden_size = x.shape, x.shape[-1]
    assert weight.shape == (hidden_size,), (weight.shape, x.shape)
    x2 = x.reshape(-1, hidden_size)  # [T, H]; copies only a non-viewable input
    assert x2.stride(-1) == 1, x2.stride()
    out = torch.empty(x2.shape, dtype=torch.result_type(x, weight), device=x.device)
    r2 = sum_out = x2  # placeholders the kernel neither reads nor writes without a residual
    if residual is not None:
        assert residual.shape == shape and residual.dtype == x.dtype, (residual.shape, shape)
        r2 = residual.reshape(-1, hidden_size)
        sum_out = torch.empty_like(x2)
    if x2.shape[0] > 0:
        _rms_norm_kernel[(x2.shape[0],)](
            x2, r2, weight, out, sum_out,
            x2.stride(0), r2.stride(0), out.stride(0), sum_out.stride(0),
            hidden_size, eps,
            HAS_RESIDUAL=residual is not None,
            BLOCK_H=next_power_of_2(hidden_size),
            **LAUNCH_OPTIONS,
        )  # fmt: skip
    return out.view(shape), None if residual is None else sum_out.view(shape)
