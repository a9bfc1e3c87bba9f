"""Unified paged attention: one launch for a varlen batch of prefill chunks and decodes.

Each program attends one query tile (see `attention_plan`) for one KV head over the keys of
its sequence, read from the block-major cache through the block table, one `tile_n`-key
step at a time with an online softmax in float32. Queries are the last tokens of their
sequence, so a chunk attends causally over its cached prefix plus itself. With
`num_splits` > 1 each program covers one slice of the key range and writes an unnormalised
partial result; `_merge_splits_kernel` combines the slices (flash-decoding).

Reference: `tandem.kernels.reference.paged_attention_ref`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tandem.kernels.attention_plan import AttentionPlan, next_power_of_2
from tandem.kernels.launch_options import LAUNCH_OPTIONS

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _unified_attention_kernel(
    q_ptr,  # [T, Hq, D]
    kv_ptr,  # [N, 2, bs, Hkv, D]
    out_ptr,  # [T, Hq, D]
    part_acc_ptr,  # [T, Hq, S, D_PAD] fp32 (used when NUM_SPLITS > 1)
    part_ml_ptr,  # [T, Hq, S, 2] fp32: running max (log2 units) and sum
    block_tables_ptr,  # [B, MB] int32
    seq_lens_ptr,  # [B] int32
    query_start_loc_ptr,  # [B + 1] int32
    tile_seq_ptr,  # [num_tiles] int32
    tile_start_ptr,  # [num_tiles] int32
    scale,
    softcap,
    sliding_window,
    num_heads,
    stride_qt,
    stride_qh,
    stride_kvn,
    stride_kvs,
    stride_kvt,
    stride_kvh,
    stride_ot,
    stride_oh,
    stride_bt,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    PAGE: tl.constexpr,
    TILE_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    IEEE_DOT: tl.constexpr,
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq = tl.load(tile_seq_ptr + tile)
    q_first = tl.load(tile_start_ptr + tile)
    q_begin = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_begin
    seq_len = tl.load(seq_lens_ptr + seq)
    context = seq_len - q_len  # cached tokens before this step's queries

    rows = tl.arange(0, BLOCK_M)
    q_idx = q_first + rows // GROUP_PAD  # [M] query within the sequence
    head = kv_head * GROUP + rows % GROUP_PAD  # [M]
    row_ok = (q_idx < q_len) & (rows % GROUP_PAD < GROUP)
    q_pos = context + q_idx  # [M] absolute position
    d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = d < HEAD_DIM
    q_off = (q_begin + q_idx).to(tl.int64)[:, None] * stride_qt + head[:, None] * stride_qh
    q = tl.load(q_ptr + q_off + d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)

    # Keys this tile can see: up to its last query, from its first query's window start.
    last_q = tl.minimum(q_first + BLOCK_Q, q_len) - 1
    kv_end = tl.minimum(seq_len, context + last_q + 1)
    kv_begin = 0
    if USE_WINDOW:
        kv_begin = tl.maximum(context + q_first - sliding_window + 1, 0)
        kv_begin = (kv_begin // TILE_N) * TILE_N
    num_steps = tl.cdiv(kv_end - kv_begin, TILE_N)
    steps_per_split = tl.cdiv(num_steps, NUM_SPLITS)
    step_lo = split * steps_per_split
    step_hi = tl.minimum(step_lo + steps_per_split, num_steps)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
    for step in range(step_lo, step_hi):
        k_pos = kv_begin + step * TILE_N + tl.arange(0, TILE_N)  # [N]
        k_ok = k_pos < kv_end
        block = tl.load(block_tables_ptr + seq * stride_bt + k_pos // PAGE, mask=k_ok, other=0)
        k_off = block.to(tl.int64) * stride_kvn + (k_pos % PAGE) * stride_kvt
        k_off += kv_head * stride_kvh
        k = tl.load(
            kv_ptr + k_off[None, :] + d[:, None], mask=k_ok[None, :] & d_ok[:, None], other=0.0
        )  # [D, N]
        v = tl.load(
            kv_ptr + stride_kvs + k_off[:, None] + d[None, :],
            mask=k_ok[:, None] & d_ok[None, :],
            other=0.0,
        )  # [N, D]
        if IEEE_DOT:  # noqa: SIM108 (constexpr branches, not a runtime choice)
            s = tl.dot(q, k, input_precision="ieee")
        else:
            s = tl.dot(q, k)  # [M, N] fp32
        if USE_SOFTCAP:
            s = s * (scale / softcap)
            s = softcap * (2.0 * tl.sigmoid(2.0 * s) - 1.0) * 1.4426950408889634  # tanh
        else:
            s = s * (scale * 1.4426950408889634)
        visible = row_ok[:, None] & k_ok[None, :] & (k_pos[None, :] <= q_pos[:, None])
        if USE_WINDOW:
            visible &= (q_pos[:, None] - k_pos[None, :]) < sliding_window
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        if IEEE_DOT:
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    token = (q_begin + q_idx).to(tl.int64)
    if NUM_SPLITS == 1:
        o = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        o_off = token[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :]
        tl.store(
            out_ptr + o_off,
            o.to(out_ptr.dtype.element_ty),
            mask=row_ok[:, None] & d_ok[None, :],
        )
    else:
        part = (token * num_heads + head) * NUM_SPLITS + split  # [M]
        tl.store(part_acc_ptr + part[:, None] * HEAD_DIM_PAD + d[None, :], acc, row_ok[:, None])
        tl.store(part_ml_ptr + part * 2, m_i, mask=row_ok)
        tl.store(part_ml_ptr + part * 2 + 1, l_i, mask=row_ok)


@triton.jit
def _merge_splits_kernel(
    out_ptr,  # [T, Hq, D]
    part_acc_ptr,  # [T, Hq, S, D_PAD] fp32
    part_ml_ptr,  # [T, Hq, S, 2] fp32
    num_heads,
    stride_ot,
    stride_oh,
    NUM_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    s = tl.arange(0, SPLITS_PAD)
    s_ok = s < NUM_SPLITS
    part = (token * num_heads + head) * NUM_SPLITS + s  # [S]
    m = tl.load(part_ml_ptr + part * 2, mask=s_ok, other=float("-inf"))
    l = tl.load(part_ml_ptr + part * 2 + 1, mask=s_ok, other=0.0)
    m_max = tl.max(m, 0)
    weight = tl.exp2(m - tl.where(m_max == float("-inf"), 0.0, m_max))  # [S]
    total = tl.sum(l * weight, 0)
    d = tl.arange(0, HEAD_DIM_PAD)
    acc = tl.load(part_acc_ptr + part[:, None] * HEAD_DIM_PAD + d[None, :], s_ok[:, None], 0.0)
    o = tl.sum(acc * weight[:, None], 0) / tl.where(total == 0.0, 1.0, total)  # [D]
    o_off = token * stride_ot + head * stride_oh + d
    tl.store(out_ptr + o_off, o.to(out_ptr.dtype.element_ty), mask=d < HEAD_DIM)


def unified_attention(
    query: torch.Tensor,  # [T, Hq, D]
    kv_layer: torch.Tensor,  # [N, 2, bs, Hkv, D]
    block_tables: torch.Tensor,  # [B, MB] int32
    seq_lens: torch.Tensor,  # [B] int32
    query_start_loc: torch.Tensor,  # [B + 1] int32
    plan: AttentionPlan,
    scale: float,
    *,
    sliding_window: int = 0,
    softcap: float = 0.0,
    out: torch.Tensor | None = None,  # [T, Hq, D]
) -> torch.Tensor:  # [T, Hq, D]
    """Causal paged attention for every query token of the batch. Writes `out` (allocated
    when None) and returns it; reads but never writes the cache."""
    _check_inputs(query, kv_layer, block_tables, seq_lens, query_start_loc)
    num_tokens, num_heads, head_dim = query.shape
    num_kv_heads, page = kv_layer.shape[3], kv_layer.shape[2]
    group = num_heads // num_kv_heads
    out = query.new_empty(query.shape) if out is None else out
    assert out.shape == query.shape and out.stride(-1) == 1, (out.shape, out.stride())
    head_dim_pad = max(16, next_power_of_2(head_dim))
    splits = plan.num_splits
    part_acc = part_ml = out  # unused placeholders when not split
    if splits > 1:
        part_acc = query.new_empty(
            (num_tokens, num_heads, splits, head_dim_pad), dtype=torch.float32
        )
        part_ml = query.new_empty((num_tokens, num_heads, splits, 2), dtype=torch.float32)
    if plan.num_tiles > 0:
        _unified_attention_kernel[(plan.num_tiles, num_kv_heads, splits)](
            query, kv_layer, out, part_acc, part_ml,
            block_tables, seq_lens, query_start_loc, plan.tile_seq, plan.tile_start,
            scale, softcap if softcap > 0 else 1.0, sliding_window, num_heads,
            query.stride(0), query.stride(1),
            kv_layer.stride(0), kv_layer.stride(1), kv_layer.stride(2), kv_layer.stride(3),
            out.stride(0), out.stride(1),
            block_tables.stride(0),
            GROUP=group,
            GROUP_PAD=next_power_of_2(group),
            BLOCK_Q=plan.block_q,
            BLOCK_M=plan.block_m,
            HEAD_DIM=head_dim,
            HEAD_DIM_PAD=head_dim_pad,
            PAGE=page,
            TILE_N=plan.tile_n,
            NUM_SPLITS=splits,
            USE_SOFTCAP=softcap > 0,
            USE_WINDOW=sliding_window > 0,
            IEEE_DOT=query.dtype == torch.float32,
            num_warps=4,
            **LAUNCH_OPTIONS,
        )  # fmt: skip
    if splits > 1 and num_tokens > 0:
        _merge_splits_kernel[(num_tokens, num_heads)](
            out, part_acc, part_ml, num_heads, out.stride(0), out.stride(1),
            NUM_SPLITS=splits,
            SPLITS_PAD=next_power_of_2(splits),
            HEAD_DIM=head_dim,
            HEAD_DIM_PAD=head_dim_pad,
            **LAUNCH_OPTIONS,
        )  # fmt: skip
    return out


def _check_inputs(
    query: torch.Tensor,
    kv_layer: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
) -> None:
    assert query.dim() == 3 and kv_layer.dim() == 5, (query.shape, kv_layer.shape)
    assert kv_layer.shape[1] == 2 and kv_layer.shape[4] == query.shape[2], kv_layer.shape
    assert query.shape[1] % kv_layer.shape[3] == 0, "query heads must be a multiple of KV heads"
    assert query.dtype in _DTYPES and kv_layer.dtype == query.dtype, (query.dtype, kv_layer.dtype)
    assert query.stride(-1) == 1 and kv_layer.stride(-1) == 1, "head_dim must be contiguous"
    for t in (block_tables, seq_lens, query_start_loc):
        assert t.dtype == torch.int32 and t.device == query.device, (t.dtype, t.device)
    assert block_tables.stride(1) == 1, block_tables.stride()
    assert query_start_loc.shape[0] == seq_lens.shape[0] + 1 == block_tables.shape[0] + 1
