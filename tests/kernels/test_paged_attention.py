"""Unified paged attention (Triton; the CPU interpreter here) against the torch reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tandem.kernels import paged_attention
from tandem.kernels.attention_plan import block_shape, choose_num_splits, plan_attention
from tandem.kernels.reference import paged_attention_ref
from tests.kernels.paged_batch import PagedBatch, paged_batch

# decodes, a prefill with no cache, chunks over cached prefixes not multiples of the block
MIXED_QUERY = [1, 7, 1, 20, 3]
MIXED_CONTEXT = [13, 0, 31, 9, 6]
# float32: the kernel and the reference sum in another order (under the interpreter tl.dot
# is NumPy's BLAS, the reference torch's, and which kernels either runs depends on the CPU).
# A float32 sum of K terms may be off by K * eps of its terms' scale; here a score sums
# head_dim products and an output up to max_seq_len weighted values, K <= 32 + 301 (or
# 128 + 41), and values are randn (below ~4): 340 * 1.2e-7 * 4 ≈ 1.6e-4. Half precision: the
# output's own rounding. A wrong block, mask or scale moves outputs by 1e-3 (one key in
# 300) to 1.
TOLERANCE = {
    torch.float32: 340 * torch.finfo(torch.float32).eps * 4,
    torch.float16: 2e-3,
    torch.bfloat16: 2e-2,
}


def run_both(
    batch: PagedBatch,
    *,
    num_splits: int | None = 1,
    num_sms: int | None = None,
    tile_n: int | None = 16,
    sliding_window: int = 0,
    softcap: float = 0.0,
    plan_dtype: torch.dtype = torch.bfloat16,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel and reference on `batch`. The plan's tiles are bf16's unless `plan_dtype`
    says otherwise, so that float32 batches here cover the wide prefill tiles too."""
    num_heads, head_dim = batch.query.shape[1:]
    num_kv_heads = batch.kv_layer.shape[3]
    plan = plan_attention(
        batch.query_start_loc_cpu,
        batch.max_seq_len,
        num_kv_heads,
        num_heads // num_kv_heads,
        batch.query.device,
        num_sms=num_sms,
        num_splits=num_splits,
        tile_n=tile_n,
        dtype=plan_dtype,
    )
    out = torch.full_like(batch.query, float("nan"))  # every element must be written
    args = (batch.kv_layer, batch.block_tables, batch.seq_lens, batch.query_start_loc)
    cache_before = batch.kv_layer.clone()
    paged_attention.unified_attention(
        batch.query,
        *args,
        plan,
        head_dim**-0.5,
        sliding_window=sliding_window,
        softcap=softcap,
        out=out,
    )
    assert torch.equal(batch.kv_layer, cache_before), "attention wrote the cache"
    ref = paged_attention_ref(
        batch.query.float(),
        batch.kv_layer.float(),
        *args[1:],
        head_dim**-0.5,
        sliding_window,
        softcap,
    )
    return out, ref


def assert_close(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert not out.isnan().any(), "some outputs were never written"
    tol = TOLERANCE[out.dtype]
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (4, 2), (8, 1), (6, 2)])
@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_mixed_batch_with_scattered_blocks(num_heads, num_kv_heads, block_size, num_splits):
    batch = paged_batch(MIXED_QUERY, MIXED_CONTEXT, num_heads, num_kv_heads, 16, block_size)
    assert_close(*run_both(batch, num_splits=num_splits))


@pytest.mark.parametrize("head_dim", [64, 96, 128])
def test_head_sizes(head_dim):
    batch = paged_batch([1, 5], [40, 11], 4, 2, head_dim, 16, seed=head_dim)
    assert_close(*run_both(batch, tile_n=32))


@pytest.mark.parametrize("num_splits", [1, 2])
def test_sliding_window_and_softcap(num_splits):
    batch = paged_batch(MIXED_QUERY, MIXED_CONTEXT, 4, 2, 16, 4, seed=3)
    out, ref = run_both(batch, num_splits=num_splits, sliding_window=5, softcap=2.0)
    assert_close(out, ref)
    plain, _ = run_both(batch, num_splits=num_splits)
    assert not torch.allclose(out, plain), "window and cap changed nothing"


def test_split_kv_on_long_decode_contexts():
    batch = paged_batch([1, 1, 2], [300, 77, 190], 8, 2, 32, 16, seed=5)
    for num_splits in (1, 4, 16):  # 16 splits: some get no key at all
        assert_close(*run_both(batch, num_splits=num_splits, tile_n=32))


@pytest.mark.parametrize("num_splits", [1, 2])
def test_float32_plans_narrow_tiles(num_splits):
    batch = paged_batch(MIXED_QUERY, MIXED_CONTEXT, 8, 2, 16, 4, seed=11)
    out, ref = run_both(batch, num_splits=num_splits, tile_n=None, plan_dtype=torch.float32)
    assert_close(out, ref)


def test_half_precision():
    batch = paged_batch(MIXED_QUERY, MIXED_CONTEXT, 4, 2, 16, 4, dtype=torch.float16, seed=7)
    assert_close(*run_both(batch, num_splits=2))


def test_padding_rows_attend_to_nothing():
    """Decode buckets pad with sequences of length 0: their rows come out zero and the real
    rows are unchanged by them."""
    real = paged_batch([1, 1], [9, 20], 4, 2, 16, 4, seed=9)
    padded = PagedBatch(
        query=torch.cat([real.query, torch.randn(2, 4, 16)]),
        kv_layer=real.kv_layer,
        block_tables=torch.cat([real.block_tables, torch.zeros_like(real.block_tables[:2])]),
        seq_lens=torch.cat([real.seq_lens, torch.zeros(2, dtype=torch.int32)]),
        query_start_loc=torch.arange(5, dtype=torch.int32),
        query_start_loc_cpu=np.arange(5, dtype=np.int32),
    )
    out, ref = run_both(padded, num_splits=2)
    assert_close(out, ref)
    assert torch.equal(out[2:], torch.zeros_like(out[2:]))
    alone, _ = run_both(real, num_splits=2)
    torch.testing.assert_close(out[:2], alone, atol=0, rtol=0)


def test_launcher_rejects_bad_inputs():
    batch = paged_batch([2], [3], 4, 2, 16, 4)
    plan = plan_attention(batch.query_start_loc_cpu, 5, 2, 2, batch.query.device)
    args = (batch.block_tables, batch.seq_lens, batch.query_start_loc, plan, 0.25)
    with pytest.raises(AssertionError, match="multiple of KV heads"):
        paged_attention.unified_attention(batch.query[:, :3], batch.kv_layer, *args)
    with pytest.raises(AssertionError):
        paged_attention.unified_attention(batch.query.double(), batch.kv_layer, *args)
    with pytest.raises(AssertionError):
        paged_attention.unified_attention(
            batch.query, batch.kv_layer, batch.block_tables.long(), *args[1:]
        )


@pytest.mark.parametrize("group", [1, 2, 3, 8, 32])
@pytest.mark.parametrize("query_lens", [[1, 1, 1], [1, 17, 5, 64, 2], [0, 3]])
def test_plan_covers_every_query_once(group, query_lens):
    qsl = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
    plan = plan_attention(qsl, 100, 2, group, torch.device("cpu"))
    covered = []
    for seq, start in zip(plan.tile_seq.tolist(), plan.tile_start.tolist()):
        stop = min(start + plan.block_q, query_lens[seq])
        assert start < stop, "a tile with no query"
        covered += [(seq, q) for q in range(start, stop)]
    assert sorted(covered) == [(b, q) for b, n in enumerate(query_lens) for q in range(n)]
    assert plan.block_m >= 16 and plan.block_m % plan.block_q == 0
    assert plan.block_m // plan.block_q >= group


def test_block_shape_and_splits():
    assert block_shape(1, 4) == (4, 16)  # decode: 16 rows, four tokens of a group of 4
    assert block_shape(30, 4) == (16, 64)  # prefill chunks: 64 rows
    assert block_shape(1, 32) == (1, 32)  # a group larger than 16 rows
    assert block_shape(30, 4, torch.float32) == (4, 16)  # float32: narrow tiles always
    assert plan_attention(np.array([0, 30]), 30, 2, 4, torch.device("cpu")).tile_n == 64
    fp32 = plan_attention(np.array([0, 30]), 30, 2, 4, torch.device("cpu"), dtype=torch.float32)
    assert (fp32.block_m, fp32.tile_n) == (16, 32)
    assert choose_num_splits(8, 32768, None) == 1  # no GPU: no split
    assert choose_num_splits(8, 32768, 132) == 16  # few programs, long context
    assert choose_num_splits(8, 512, 132) == 2  # bounded by the context
    assert choose_num_splits(512, 32768, 132) == 1  # enough programs already
