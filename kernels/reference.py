"""Plain-torch reference kernels: the CPU path, and the oracle for the Triton kernels.

Shapes use T tokens in the flattened batch, B sequences, Hq query heads, Hkv KV heads,
D head size, N blocks of `bs` tokens. A layer's cache is the view `kv_cache[:, layer]`
of the block-major tensor: [N, 2, bs, Hkv, D].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def write_kv_ref(
    key: torch.Tensor,  # [T, Hkv, D]
    value: torch.Tensor,  # [T, Hkv, D]
    kv_layer: torch.Tensor,  # [N, 2, bs, Hkv, D], written in place
    slot_mapping: torch.Tensor,  # [T] int64: block_id * bs + offset; negative = skip
) -> None:
    block_size = kv_layer.shape[2]
    if bool((slot_mapping < 0).any()):
        keep = slot_mapping >= 0
        key, value, slot_mapping = key[keep], value[keep], slot_mapping[keep]
    block_ids = slot_mapping // block_size
    offsets = slot_mapping % block_size
    kv_layer[block_ids, 0, offsets] = key.to(kv_layer.dtype)
    kv_layer[block_ids, 1, offsets] = value.to(kv_layer.dtype)


def gather_kv_ref(
    kv_layer: torch.Tensor,  # [N, 2, bs, Hkv, D]
    block_tables: torch.Tensor,  # [B, MB] int
    workspace: torch.Tensor | None = None,  # flat, >= 2 * B * MB * bs * Hkv * D elements
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of each sequence laid out contiguously: two [B, MB * bs, Hkv, D] tensors.

    K and V are gathered separately so that each is copied once (gathering both and then
    splitting would copy twice). With a `workspace` (same dtype and device as the cache)
    both are written into it and returned as views of it, so no memory is allocated.
    """
    num_seqs, max_blocks = block_tables.shape
    _, _, block_size, num_kv_heads, head_dim = kv_layer.shape
    index = block_tables.reshape(-1).long()
    shape = (num_seqs, max_blocks * block_size, num_kv_heads, head_dim)
    # Each block's K (or V) is one contiguous row: index_select copies rows, the fastest
    # gather torch has on the CPU.
    k_rows, v_rows = kv_layer.select(1, 0).flatten(1), kv_layer.select(1, 1).flatten(1)
    if workspace is None:
        return k_rows.index_select(0, index).view(shape), v_rows.index_select(0, index).view(shape)
    rows = (index.numel(), k_rows.shape[1])
    size = rows[0] * rows[1]
    k = torch.index_select(k_rows, 0, index, out=workspace[:size].view(rows))
    v = torch.index_select(v_rows, 0, index, out=workspace[size : 2 * size].view(rows))
    return k.view(shape), v.view(shape)


def gather_kv_by_head(
    kv_layer: torch.Tensor,  # [N, 2, bs, Hkv, D]
    block_tables: torch.Tensor,  # [B, MB] int
    workspace: torch.Tensor,  # flat, >= 2 * B * MB * bs * Hkv * D elements, the cache's dtype
) -> tuple[torch.Tensor, torch.Tensor]:  # two [Hkv, B, MB * bs, D] views of the workspace
    """K and V of each sequence, one contiguous [S, D] matrix per KV head and sequence: the
    operands of a batched matmul (a [B, S, Hkv, D] copy would leave each head's rows strided,
    which torch's bmm copies again). One `index_select` for K and V together over the
    cache's head-major view (within a block a head's rows are D apart, so it copies D
    elements at a time)."""
    num_seqs, max_blocks = block_tables.shape
    _, _, block_size, num_kv_heads, head_dim = kv_layer.shape
    index = block_tables.reshape(-1).long()
    rows = (2, num_kv_heads, index.numel(), block_size, head_dim)
    out = workspace[: 2 * num_kv_heads * index.numel() * block_size * head_dim].view(rows)
    # K and V in one call on the whole permuted view: `index_select` of one of its halves
    # (a `select`ed view) takes a path 50-200 times slower in torch 2.13.
    torch.index_select(kv_layer.permute(1, 3, 0, 2, 4), 2, index, out=out)  # [2, Hkv, N, bs, D]
    shape = (num_kv_heads, num_seqs, max_blocks * block_size, head_dim)
    return out[0].view(shape), out[1].view(shape)


def attention_ref(
    query: torch.Tensor,  # [B, Q, Hq, D]
    key: torch.Tensor,  # [B, S, Hkv, D]
    value: torch.Tensor,  # [B, S, Hkv, D]
    query_positions: torch.Tensor,  # [B, Q] int: absolute position of each query token
    seq_lens: torch.Tensor,  # [B] int: valid keys per sequence
    scale: float,
    sliding_window: int = 0,
    softcap: float = 0.0,
) -> torch.Tensor:  # [B, Q, Hq, D]
    """Causal attention with grouped-query heads, accumulated in float32.

    Key j of sequence b is visible to a query at position p when j <= p and j < seq_lens[b],
    and, with a `sliding_window` W > 0, when p - j < W. A `softcap` c > 0 maps each scaled
    score s to c * tanh(s / c) before the mask. A query that sees no key gets zeros.
    """
    num_seqs, num_q, num_heads, head_dim = query.shape
    num_keys, num_kv_heads = key.shape[1], key.shape[2]
    group = num_heads // num_kv_heads
    q = query.float().view(num_seqs, num_q, num_kv_heads, group, head_dim).permute(0, 2, 3, 1, 4)
    k = key.float().permute(0, 2, 3, 1)  # [B, Hkv, D, S]
    v = value.float().transpose(1, 2)  # [B, Hkv, S, D]
    scores = torch.matmul(q.reshape(num_seqs, num_kv_heads, group * num_q, head_dim), k)
    scores = scores.view(num_seqs, num_kv_heads, group, num_q, num_keys) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    key_idx = torch.arange(num_keys, device=query.device)
    visible = (key_idx <= query_positions[..., None]) & (key_idx < seq_lens[:, None, None])
    if sliding_window > 0:
        visible &= query_positions[..., None] - key_idx < sliding_window
    scores = scores.masked_fill(~visible[:, None, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows that see no key -> 0
    probs = probs.view(num_seqs, num_kv_heads, group * num_q, num_keys)
    out = torch.matmul(probs, v).view(num_seqs, num_kv_heads, group, num_q, head_dim)
    return out.permute(0, 3, 1, 2, 4).reshape(num_seqs, num_q, num_heads, head_dim).to(query.dtype)


def paged_attention_ref(
    query: torch.Tensor,  # [T, Hq, D]
    kv_layer: torch.Tensor,  # [N, 2, bs, Hkv, D]
    block_tables: torch.Tensor,  # [B, MB] int
    seq_lens: torch.Tensor,  # [B] int
    query_start_loc: torch.Tensor,  # [B + 1] int
    scale: float,
    sliding_window: int = 0,
    softcap: float = 0.0,
) -> torch.Tensor:  # [T, Hq, D]
    """A varlen batch over the paged cache, one sequence at a time: sequence b's queries are
    the last `query_start_loc[b+1] - query_start_loc[b]` of its `seq_lens[b]` tokens."""
    out = torch.zeros_like(query)
    block_size = kv_layer.shape[2]
    for b in range(len(seq_lens)):
        start, end = int(query_start_loc[b]), int(query_start_loc[b + 1])
        seq_len = int(seq_lens[b])
        num_blocks = -(-seq_len // block_size)
        if end == start or num_blocks == 0:
            continue
        k, v = gather_kv_ref(kv_layer, block_tables[b : b + 1, :num_blocks])
        positions = torch.arange(seq_len - (end - start), seq_len, device=query.device)
        out[start:end] = attention_ref(
            query[None, start:end],
            k,
            v,
            positions[None],
            seq_lens[b : b + 1],
            scale,
            sliding_window,
            softcap,
        )[0]
    return out


def rms_norm_ref(
    x: torch.Tensor,  # [T, H]
    weight: torch.Tensor,  # [H]
    eps: float,
    residual: torch.Tensor | None = None,  # [T, H]
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """RMSNorm in float32; with `residual`, first adds it and also returns the sum (the new
    residual stream)."""
    if residual is not None:
        x = x + residual
        residual = x
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype), residual


def rotary_ref(
    positions: torch.Tensor,  # [T] int
    query: torch.Tensor,  # [T, Hq, D], rotated in place
    key: torch.Tensor,  # [T, Hkv, D], rotated in place
    cos_sin_cache: torch.Tensor,  # [max_pos, D]: cos in [:, :D/2], sin in [:, D/2:]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox-style rotary embedding (rotate the two halves), as Llama in transformers,
    computed in float32. Rotates in place, like the Triton kernel, and returns the pair."""
    cos, sin = cos_sin_cache[positions].chunk(2, dim=-1)  # [T, D/2] each
    cos, sin = cos[:, None], sin[:, None]  # [T, 1, D/2]
    for heads in joint_heads(query, key):
        _rotate_(heads, cos, sin)
    return query, key


def joint_heads(query: torch.Tensor, key: torch.Tensor) -> list[torch.Tensor]:
    """[q, k], or one [T, Hq + Hkv, D] view of both when each row's key heads directly
    follow its query heads (the fused qkv projection's output), so every op runs once."""
    num_tokens, num_heads, head_dim = query.shape
    shape = (num_tokens, num_heads + key.shape[1], head_dim)
    adjacent = (
        key.dtype == query.dtype
        and key.shape[0] == num_tokens
        and query.stride() == key.stride()
        and query.stride()[1:] == (head_dim, 1)
        and query.stride(0) >= shape[1] * head_dim  # rows of the joint view do not overlap
        and key.data_ptr() == query.data_ptr() + num_heads * head_dim * query.element_size()
    )
    if not adjacent:
        return [query, key]
    return [query.as_strided(shape, query.stride())]


def _rotate_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """x [T, H, D] <- (x1 cos - x2 sin, x2 cos + x1 sin), each half [T, H, D/2]."""
    x1, x2 = x.chunk(2, dim=-1)
    if x.dtype != torch.float32:
        f1, f2 = x1.float(), x2.float()
        x1.copy_(f1 * cos - f2 * sin)
        x2.copy_(f2 * cos + f1 * sin)
        return
    x1_sin, x2_sin = x1 * sin, x2 * sin
    x1.mul_(cos).sub_(x2_sin)
    x2.mul_(cos).add_(x1_sin)


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:  # [T, 2I] -> [T, I]
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate).mul_(up)
