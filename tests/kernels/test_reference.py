"""The reference kernels and the CPU attention backend against dense causal attention."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tandem.engine.attention.backend import CommonAttentionMetadata
from tandem.engine.attention.torch_backend import TorchAttentionBackend
from tandem.kernels.reference import (
    attention_ref,
    gather_kv_by_head,
    gather_kv_ref,
    joint_heads,
    rotary_ref,
    write_kv_ref,
)
from tandem.kernels.rotary_tables import rotary_by_tables, rotary_tables

# The backend and dense SDPA sum in another order (other kernels, chosen per CPU): a float32
# sum of K terms may be off by K * eps of its terms' scale. Here K <= head_dim + keys = 16 + 22,
# and values are randn (below ~4). A wrong block or mask moves outputs by far more.
ATTENTION_TOL = (16 + 22) * torch.finfo(torch.float32).eps * 4


def dense_attention(q, k, v, scale):  # q [Q, Hq, D], k/v [S, Hkv, D], queries are the last Q
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    num_q, num_k = q.shape[0], k.shape[0]
    mask = torch.ones(num_q, num_k, dtype=torch.bool).tril(num_k - num_q)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=scale
    )
    return out.transpose(0, 1)


def test_write_kv_skips_negative_slots():
    cache = torch.zeros(4, 2, 4, 1, 2)  # [N, 2, bs, Hkv, D]
    key = torch.arange(6.0).view(3, 1, 2)
    slots = torch.tensor([5, -1, 14])
    write_kv_ref(key, -key, cache, slots)
    assert torch.equal(cache[1, 0, 1, 0], key[0, 0])
    assert torch.equal(cache[3, 1, 2, 0], -key[2, 0])
    assert int((cache != 0).any(-1).sum()) == 4  # two slots, K and V each


def test_gather_into_a_workspace_matches_a_fresh_gather():
    torch.manual_seed(0)
    kv_layer = torch.randn(10, 2, 4, 2, 3)  # [N, 2, bs, Hkv, D]
    tables = torch.tensor([[7, 2, 9], [0, 5, 5]])
    workspace = torch.full((2 * 6 * 4 * 2 * 3 + 5,), float("nan"))
    k, v = gather_kv_ref(kv_layer, tables, workspace)
    k_ref, v_ref = gather_kv_ref(kv_layer, tables)
    assert torch.equal(k, k_ref) and torch.equal(v, v_ref)
    assert torch.equal(k[0, 4:8], kv_layer[2, 0]) and torch.equal(v[1, 8:], kv_layer[5, 1])
    # both are views of the workspace, not new memory
    assert k.untyped_storage().data_ptr() == workspace.untyped_storage().data_ptr()
    assert v.data_ptr() == k.data_ptr() + k.numel() * k.element_size()


def test_gather_by_head_lays_each_head_of_each_sequence_out_contiguously():
    torch.manual_seed(0)
    kv_layer = torch.randn(10, 2, 4, 3, 5)  # [N, 2, bs, Hkv, D]
    tables = torch.tensor([[7, 2, 9], [0, 5, 5]])
    workspace = torch.full((2 * 6 * 4 * 3 * 5 + 7,), float("nan"))
    k, v = gather_kv_by_head(kv_layer, tables, workspace)  # [Hkv, B, S, D]
    k_ref, v_ref = gather_kv_ref(kv_layer, tables)  # [B, S, Hkv, D]
    assert torch.equal(k, k_ref.permute(2, 0, 1, 3)) and torch.equal(v, v_ref.permute(2, 0, 1, 3))
    assert k.is_contiguous() and v.is_contiguous()
    assert k.data_ptr() == workspace.data_ptr()  # views of the workspace


@pytest.mark.parametrize("decode_group_size", [1, 16])  # SDPA alone; the batched matmuls
@pytest.mark.parametrize("by_sequence_heads", [0, 16])  # their operands by head; by sequence
def test_bf16_decode_is_float64_attention_within_bf16_rounding(
    decode_group_size, by_sequence_heads
):
    """bf16 decode against float64 attention over the same bf16 values, within
    `bf16_bound`."""
    torch.manual_seed(0)
    bf16, num_heads, num_kv_heads, head_dim, block_size = torch.bfloat16, 6, 2, 16, 4
    seq_lens = np.array([9, 3, 17, 12, 6], dtype=np.int32)
    tables = torch.randperm(40)[: 5 * 5].view(5, 5).to(torch.int32)
    kv_layer = torch.randn(40, 2, block_size, num_kv_heads, head_dim).to(bf16)
    q = torch.randn(5, num_heads, head_dim).to(bf16)
    slots = tables[torch.arange(5), (seq_lens - 1) // block_size] * block_size
    slots = (slots + torch.from_numpy((seq_lens - 1) % block_size)).long()
    new_k = kv_layer[slots // block_size, 0, slots % block_size]  # rewrite what is there
    new_v = kv_layer[slots // block_size, 1, slots % block_size]
    common = CommonAttentionMetadata.from_host(
        np.arange(6, dtype=np.int32), seq_lens, tables.numpy(), slots.numpy(), torch.device("cpu")
    )
    backend = TorchAttentionBackend(
        block_size,
        decode_group_size,
        dtype=bf16,
        batched_from=2,
        by_sequence_heads=by_sequence_heads,
    )
    out = backend.forward(q, new_k, new_v, kv_layer, backend.build(common), scale=0.25)
    k, v = gather_kv_ref(kv_layer, tables)  # [B, S, Hkv, D]
    for b, n in enumerate(seq_lens.tolist()):
        qb, kb, vb = q[b : b + 1].double(), k[b, :n].double(), v[b, :n].double()
        expected = dense_attention(qb, kb, vb, scale=0.25)[0]
        assert (out[b].double() - expected).abs().max() <= bf16_bound(qb, kb, vb, 0.25)


@pytest.mark.parametrize("prefill_rows", [4, 256])  # 10 queries in chunks of 4; at once
def test_bf16_prefill_is_float64_attention_within_bf16_rounding(prefill_rows):
    """A chunk of 10 new tokens after 7 cached ones, in bf16 by matmuls, against float64
    attention over the same bf16 values; the bound as for decode."""
    torch.manual_seed(0)
    bf16, num_heads, num_kv_heads, head_dim, block_size = torch.bfloat16, 6, 2, 16, 4
    cached, new = 7, 10
    table = torch.randperm(20)[:5].to(torch.int32)  # 17 tokens in 5 blocks of 4
    kv_layer = torch.randn(20, 2, block_size, num_kv_heads, head_dim).to(bf16)
    positions = torch.arange(cached + new)
    slots = table[positions // block_size].long() * block_size + positions % block_size
    k = kv_layer[slots // block_size, 0, slots % block_size]  # [17, Hkv, D]
    v = kv_layer[slots // block_size, 1, slots % block_size]
    q = torch.randn(new, num_heads, head_dim).to(bf16)
    common = CommonAttentionMetadata.from_host(
        np.array([0, new], dtype=np.int32),
        np.array([cached + new], dtype=np.int32),
        table[None].numpy(),
        slots[cached:].numpy(),
        torch.device("cpu"),
    )
    backend = TorchAttentionBackend(block_size, dtype=bf16, prefill_rows=prefill_rows)
    metadata = backend.build(common)
    out = backend.forward(q, k[cached:], v[cached:], kv_layer, metadata, scale=0.25)
    expected = dense_attention(q.double(), k.double(), v.double(), scale=0.25)
    for i in range(new):  # query i sees keys 0 .. cached + i
        qi, ki, vi = q[i : i + 1].double(), k[: cached + i + 1].double(), v[: cached + i + 1]
        bound = bf16_bound(qi, ki, vi.double(), 0.25)
        assert (out[i].double() - expected[i]).abs().max() <= bound


def bf16_bound(q, k, v, scale):  # q [1, Hq, D], k/v [S, Hkv, D], float64
    """How far bf16 attention may be from float64's over the same bf16 values: the scores
    round to bf16 (relative 2**-8) and the probabilities too, so with |s| the largest
    scaled score and |v| the largest value the output moves by at most about
    (2 |s| + 2) 2**-8 |v|, plus its own rounding. A wrong block or mask moves it by O(|v|)."""
    group = q.shape[1] // k.shape[1]
    biggest = (q[0, :, None] @ k.repeat_interleave(group, 1).permute(1, 2, 0)).abs().max()
    return ((2 * biggest * scale + 2) * 2**-8 + 2**-8) * v.abs().max()


def test_rotary_matches_transformers():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    dim, positions = 16, torch.tensor([0, 3, 17, 100])
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    freqs = torch.outer(torch.arange(128).float(), inv_freq)
    cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    q, k = torch.randn(4, 3, dim), torch.randn(4, 1, dim)
    ours_q, ours_k = rotary_ref(positions, q.clone(), k.clone(), cache)
    emb = torch.cat((freqs[positions], freqs[positions]), dim=-1)
    ref_q, ref_k = apply_rotary_pos_emb(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], emb.cos()[None], emb.sin()[None]
    )
    torch.testing.assert_close(ours_q, ref_q[0].transpose(0, 1))
    torch.testing.assert_close(ours_k, ref_k[0].transpose(0, 1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_rotates_a_fused_qkv_buffer_in_place(dtype):
    dim, positions = 16, torch.tensor([0, 3, 17, 100, 3])
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    freqs = torch.outer(torch.arange(128).float(), inv_freq)
    cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    qkv = torch.randn(5, (4 + 2 + 2) * dim).to(dtype)  # [T, (Hq + 2 Hkv) D], as projected
    q = qkv[:, : 4 * dim].view(5, 4, dim)
    k = qkv[:, 4 * dim : 6 * dim].view(5, 2, dim)
    v_before, q_before, k_before = qkv[:, 6 * dim :].clone(), q.clone(), k.clone()
    # q and k apart (fresh tensors) go through the per-tensor path
    apart_q, apart_k = rotary_ref(positions, q.clone(), k.clone(), cache)
    out_q, out_k = rotary_ref(positions, q, k, cache)  # adjacent in qkv: one joint view
    assert out_q.data_ptr() == q.data_ptr() and out_k.data_ptr() == k.data_ptr()
    assert not torch.equal(q, q_before) and not torch.equal(k, k_before)
    assert torch.equal(out_q, apart_q) and torch.equal(out_k, apart_k)
    assert torch.equal(qkv[:, 6 * dim :], v_before), "rotary touched the values"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("adjacent", [True, False])
def test_rotary_by_step_tables_equals_the_reference(dtype, adjacent):
    """The torch path's rotary (tables made once a step) does the reference's float32
    arithmetic: the same bits, in a fused qkv buffer or on separate tensors."""
    dim, positions = 16, torch.tensor([0, 3, 17, 100, 3])
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    freqs = torch.outer(torch.arange(128).float(), inv_freq)
    cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    qkv = torch.randn(5, (4 + 2 + 2) * dim).to(dtype)
    q = qkv[:, : 4 * dim].view(5, 4, dim)
    k = qkv[:, 4 * dim : 6 * dim].view(5, 2, dim)
    if not adjacent:
        q, k = q.clone(), k.clone()
    ref_q, ref_k = rotary_ref(positions, q.clone(), k.clone(), cache)
    out_q, out_k = rotary_by_tables(rotary_tables(positions, cache), q, k)
    assert out_q.data_ptr() == q.data_ptr() and out_k.data_ptr() == k.data_ptr()
    assert torch.equal(out_q, ref_q) and torch.equal(out_k, ref_k)


def test_rotary_joins_query_and_key_only_when_they_tile_each_row():
    qkv = torch.randn(5, (4 + 2 + 2) * 8)
    q, k = qkv[:, :32].view(5, 4, 8), qkv[:, 32:48].view(5, 2, 8)
    (joint,) = joint_heads(q, k)
    assert joint.shape == (5, 6, 8) and torch.equal(joint[:, 4:], k)
    rows = torch.randn(6, 2, 8)  # key = query shifted one row: a joint view would overlap
    assert len(joint_heads(rows[:5], rows[1:])) == 2
    assert len(joint_heads(q, k.clone())) == 2  # separate tensors
    assert len(joint_heads(q, qkv[:, 40:56].view(5, 2, 8))) == 2  # a gap between them


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (4, 2), (8, 1)])
@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("decode_group_size", [2, 3, 16])  # 3: groups of 3 and 1
# decodes by matmuls from 2 sequences on, operands by head, prefills by matmul; by sequence,
# prefills 4 query rows at a time; SDPA only (no score fits the prefills' budget)
@pytest.mark.parametrize(
    "paths",
    [
        {"batched_from": 2, "by_sequence_heads": 0},
        {"batched_from": 2, "by_sequence_heads": 16, "prefill_rows": 4},
        {"batched_from": 8, "score_budget": 0},
    ],
)
def test_backend_on_a_mixed_batch_with_scattered_blocks(
    num_heads, num_kv_heads, block_size, decode_group_size, paths
):
    torch.manual_seed(0)
    head_dim, num_blocks = 16, 64
    # (cached prefix, new tokens): decodes, a fresh prefill, a chunk after an odd prefix
    # with groups of 2, the four decodes are sorted by length into two groups
    seqs = [(9, 1), (0, 13), (21, 1), (7, 6), (0, 1), (3, 1)]
    perm = torch.randperm(num_blocks).tolist()  # scattered, non-monotonic block ids
    tables, full_k, full_v = [], [], []
    kv_layer = torch.zeros(num_blocks, 2, block_size, num_kv_heads, head_dim)
    for cached, new in seqs:
        need = -(-(cached + new) // block_size)
        tables.append([perm.pop() for _ in range(need)])
        full_k.append(torch.randn(cached + new, num_kv_heads, head_dim))
        full_v.append(torch.randn(cached + new, num_kv_heads, head_dim))
        for pos in range(cached):  # the prefix is already in the cache
            blk, off = tables[-1][pos // block_size], pos % block_size
            kv_layer[blk, 0, off], kv_layer[blk, 1, off] = full_k[-1][pos], full_v[-1][pos]
    query_lens = [new for _, new in seqs]
    seq_lens = np.array([c + n for c, n in seqs], dtype=np.int32)
    qsl = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
    width = max(map(len, tables))
    bt = np.zeros((len(seqs), width), dtype=np.int32)
    for i, t in enumerate(tables):
        bt[i, : len(t)] = t
    slots = [
        tables[i][p // block_size] * block_size + p % block_size
        for i, (c, n) in enumerate(seqs)
        for p in range(c, c + n)
    ]
    slot_mapping = np.array(slots, dtype=np.int64)
    common = CommonAttentionMetadata.from_host(qsl, seq_lens, bt, slot_mapping, torch.device("cpu"))
    q = torch.randn(int(qsl[-1]), num_heads, head_dim)
    new_k = torch.cat([k[c:] for k, (c, _) in zip(full_k, seqs)])
    new_v = torch.cat([v[c:] for v, (c, _) in zip(full_v, seqs)])
    backend = TorchAttentionBackend(block_size, decode_group_size, num_heads=num_heads, **paths)
    metadata = backend.build(common)
    assert len(metadata.decodes) == -(-4 // decode_group_size)
    assert len(metadata.prefills) == 2
    sdpa = paths.get("score_budget") == 0  # only SDPA reads a mask: the one after a prefix
    assert [p.mask is not None for p in metadata.prefills] == [False, sdpa]
    out = backend.forward(q, new_k, new_v, kv_layer, metadata, scale=0.25)
    workspace = backend._workspace
    again = backend.forward(q, new_k, new_v, kv_layer, metadata, scale=0.25)
    assert torch.equal(again, out) and backend._workspace is workspace  # reused, not regrown
    for i in range(len(seqs)):
        s, e = int(qsl[i]), int(qsl[i + 1])
        expected = dense_attention(q[s:e], full_k[i], full_v[i], scale=0.25)
        torch.testing.assert_close(out[s:e], expected, rtol=0, atol=ATTENTION_TOL)


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (6, 2)])
def test_attention_ref_is_causal_attention(num_heads, num_kv_heads):
    torch.manual_seed(1)
    seq_lens = torch.tensor([7, 12])
    num_q, max_len, head_dim = 5, 12, 8
    q = torch.randn(2, num_q, num_heads, head_dim)
    k = torch.randn(2, max_len, num_kv_heads, head_dim)
    v = torch.randn(2, max_len, num_kv_heads, head_dim)
    positions = seq_lens[:, None] - num_q + torch.arange(num_q)  # the last Q tokens
    out = attention_ref(q, k, v, positions, seq_lens, scale=0.3)
    for b, n in enumerate(seq_lens.tolist()):
        expected = dense_attention(q[b], k[b, :n], v[b, :n], scale=0.3)
        torch.testing.assert_close(out[b], expected, rtol=0, atol=ATTENTION_TOL)
