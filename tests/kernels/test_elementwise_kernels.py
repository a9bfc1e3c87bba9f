"""KV write, fused-residual RMSNorm, rotary and SiLU-and-mul (Triton; the CPU interpreter
here) against their torch references."""

from __future__ import annotations

import pytest
import torch

from tandem.engine.core.config import RopeScaling
from tandem.engine.models.layers import llama3_scale_inv_freq
from tandem.kernels import kv_write
from tandem.kernels.activation import silu_and_mul
from tandem.kernels.reference import rms_norm_ref, rotary_ref, silu_and_mul_ref, write_kv_ref
from tandem.kernels.rms_norm import rms_norm
from tandem.kernels.rotary import rotary

DTYPES = [torch.float32, torch.float16]
# float32: the kernels and references may differ by a few ulps elementwise, and RMSNorm's
# mean of squares over <= 80 features by 80 * eps ≈ 1e-5 relative; half precision: the
# output's own rounding.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("num_kv_heads", "head_dim", "block_size"), [(2, 16, 4), (1, 24, 16)])
def test_write_kv_matches_reference(dtype, num_kv_heads, head_dim, block_size):
    gen = torch.Generator().manual_seed(head_dim)
    num_blocks, num_tokens = 6, 9
    # keys as a strided view of a fused qkv row, as the model hands them over
    qkv = torch.randn(num_tokens, 3 * num_kv_heads * head_dim, generator=gen).to(dtype)
    key = qkv[:, : num_kv_heads * head_dim].view(num_tokens, num_kv_heads, head_dim)
    value = qkv[:, num_kv_heads * head_dim : 2 * num_kv_heads * head_dim]
    value = value.view(num_tokens, num_kv_heads, head_dim)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[[1, 4]] = -1  # skipped
    cache = torch.randn(num_blocks, 2, block_size, num_kv_heads, head_dim, generator=gen)
    cache = cache.to(dtype)
    expected = cache.clone()
    write_kv_ref(key, value, expected, slots)
    kv_write.write_kv(key, value, cache, slots)
    assert torch.equal(cache, expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden_size", [64, 80])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_reference(dtype, hidden_size, with_residual):
    gen = torch.Generator().manual_seed(hidden_size)
    x = torch.randn(7, hidden_size, generator=gen).to(dtype)
    weight = torch.randn(hidden_size, generator=gen).to(dtype)
    residual = torch.randn(7, hidden_size, generator=gen).to(dtype) if with_residual else None
    x_before = x.clone()
    out, new_residual = rms_norm(x, weight, 1e-6, residual)
    ref, ref_residual = rms_norm_ref(x, weight, 1e-6, residual)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
    assert torch.equal(x, x_before), "the input was written"
    if with_residual:
        torch.testing.assert_close(new_residual, ref_residual, atol=tol, rtol=tol)
    else:
        assert new_residual is None


def test_rms_norm_per_head_on_a_strided_view():
    """Qwen3's q/k norm: [T, H, D] heads of a fused projection, normalised per head."""
    qkv = torch.randn(5, 7 * 16)
    q = qkv[:, : 4 * 16].view(5, 4, 16)
    weight = torch.randn(16)
    out, _ = rms_norm(q, weight, 1e-6)
    torch.testing.assert_close(out, rms_norm_ref(q, weight, 1e-6)[0])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scaled", [False, True])
def test_rotary_in_place_matches_reference(dtype, scaled):
    head_dim, max_pos = 32, 300
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    if scaled:
        inv_freq = llama3_scale_inv_freq(inv_freq, RopeScaling(8.0, 1.0, 4.0, 64))
    freqs = torch.outer(torch.arange(max_pos).float(), inv_freq)
    cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    positions = torch.tensor([0, 299, 5, 5, 128, 1])  # per token, any order
    qkv = torch.randn(6, (4 + 2 + 2) * head_dim).to(dtype)
    q = qkv[:, : 4 * head_dim].view(6, 4, head_dim)
    k = qkv[:, 4 * head_dim : 6 * head_dim].view(6, 2, head_dim)
    v_before = qkv[:, 6 * head_dim :].clone()
    ref_q, ref_k = rotary_ref(positions, q.clone(), k.clone(), cache)
    out_q, out_k = rotary(positions, q, k, cache)
    assert out_q.data_ptr() == q.data_ptr() and out_k.data_ptr() == k.data_ptr()
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(q, ref_q, atol=tol, rtol=tol)
    torch.testing.assert_close(k, ref_k, atol=tol, rtol=tol)
    assert torch.equal(qkv[:, 6 * head_dim :], v_before), "rotary touched the values"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inner", [48, 1100])  # one block, and more than one
def test_silu_and_mul_matches_reference(dtype, inner):
    x = torch.randn(3, 2 * inner).to(dtype)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(silu_and_mul(x), silu_and_mul_ref(x), atol=tol, rtol=tol)


def test_empty_batches_launch_nothing():
    empty = torch.empty(0, 2, 16)
    cache = torch.zeros(2, 2, 4, 2, 16)
    kv_write.write_kv(empty, empty, cache, torch.empty(0, dtype=torch.long))
    assert not cache.any()
    assert silu_and_mul(torch.empty(0, 8)).shape == (0, 4)
    assert rms_norm(torch.empty(0, 8), torch.ones(8), 1e-6)[0].shape == (0, 8)
