"""The Triton kernels compiled for a real GPU, at model sizes and in bf16/fp16."""

from __future__ import annotations

import pytest
import torch

from tandem.kernels.activation import silu_and_mul
from tandem.kernels.kv_write import write_kv
from tandem.kernels.reference import rms_norm_ref, silu_and_mul_ref, write_kv_ref
from tandem.kernels.rms_norm import rms_norm
from tests.kernels.paged_batch import paged_batch
from tests.kernels.test_paged_attention import assert_close, run_both

pytestmark = pytest.mark.gpu


def num_sms() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(32, 8), (32, 32), (28, 4)])
@pytest.mark.parametrize("head_dim", [64, 96, 128])
def test_attention_mixed_batch_at_model_sizes(dtype, num_heads, num_kv_heads, head_dim):
    batch = paged_batch(
        [1, 1, 300, 1, 77, 1],
        [4000, 17, 0, 1023, 515, 2049],
        num_heads,
        num_kv_heads,
        head_dim,
        16,
        dtype=dtype,
        device="cuda",
        seed=head_dim,
    )
    plan = {"num_sms": num_sms(), "tile_n": None, "plan_dtype": dtype}  # as the engine plans
    assert_close(*run_both(batch, num_splits=None, **plan))


@pytest.mark.parametrize("num_splits", [1, 8, 16])
def test_split_kv_long_context_decode(num_splits):
    batch = paged_batch(
        [1] * 4, [32000, 8191, 17, 16000], 32, 8, 128, 16, dtype=torch.bfloat16, device="cuda"
    )
    assert_close(*run_both(batch, num_splits=num_splits, tile_n=64))


def test_sliding_window_and_softcap_on_gpu():
    batch = paged_batch(
        [1, 200, 1], [3000, 100, 60], 16, 8, 128, 16, dtype=torch.bfloat16, device="cuda"
    )
    out, ref = run_both(
        batch, num_splits=None, num_sms=num_sms(), sliding_window=1024, softcap=30.0
    )
    assert_close(out, ref)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_elementwise_kernels_at_model_sizes(dtype):
    x = torch.randn(300, 4096, device="cuda", dtype=dtype)
    residual = torch.randn_like(x)
    weight = torch.randn(4096, device="cuda", dtype=dtype)
    out, new_residual = rms_norm(x, weight, 1e-5, residual)
    ref, ref_residual = rms_norm_ref(x, weight, 1e-5, residual)
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(new_residual, ref_residual)
    gate_up = torch.randn(300, 2 * 14336, device="cuda", dtype=dtype)
    torch.testing.assert_close(
        silu_and_mul(gate_up), silu_and_mul_ref(gate_up), atol=2e-2, rtol=2e-2
    )
    key = torch.randn(300, 8, 128, device="cuda", dtype=dtype)
    cache = torch.zeros(64, 2, 16, 8, 128, device="cuda", dtype=dtype)
    expected = cache.clone()
    slots = torch.randperm(64 * 16, device="cuda")[:300]
    write_kv(key, -key, cache, slots)
    write_kv_ref(key, -key, expected, slots)
    assert torch.equal(cache, expected)
