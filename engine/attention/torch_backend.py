"""The CPU attention backend: plain torch, reading K/V through block tables.

Decoding sequences (one query token) are sorted by context length and attend in batched
groups, each padded only to its own longest context; prefill chunks attend one sequence at
a time, so padding never multiplies a long chunk by the batch size.

A decode group of 8 sequences or more attends by two batched matmuls around a float32
softmax. Torch's fused CPU `scaled_dot_product_attention` costs about 15 us per
(sequence, KV head) at G = 3 query rows: 3-6 times the matmuls at 16 sequences
(docs/notes/performance-2026-11-engine.md). The matmuls' operands come one of two ways:

- *by sequence* (models of at most `by_sequence_heads` query heads): K/V gathered a whole
  block row at a time, as the cache lays them out ([S, Hkv * D] per sequence), and every
  query head of a sequence multiplied against all of it at once, each head's query
  written into its own KV head's D columns of an [Hq, Hkv * D] block-diagonal matrix
  (zeros elsewhere); the output's diagonal blocks are the heads' results. Hkv times the
  multiply-adds, but the gather copies whole rows (the prefetcher's best case) and nothing
  is permuted; while Hq rows share each K element the matmul stays bound by reading K.
- *by head*: K/V gathered head-major (one contiguous [S, D] matrix per KV head and
  sequence, copied D elements at a time), the GQA group of G query heads as G rows
  against its KV head. No extra work, a slower gather.

On the 2-CPU EPYC, a SmolLM2 layer (Hq 9, Hkv 3, D 64), 16 sequences of 288 keys, caches
cold: 416 against 616 us by head with one thread, 287-306 against 360 with two; at Hq 32,
Hkv 8, D 128 by sequence loses (4.1 against 2.8 ms). In bfloat16 the scores leave the
matmul rounded to bfloat16 (as in transformers' eager attention), then the softmax runs in
float32. Smaller decode groups run the fused SDPA on strided views of the gathered K/V.

A prefill chunk attends by matmuls too, a few hundred query rows at a time: each KV head's
GQA group of query heads as one [rows * G, D] matrix against its K (the cached prefix and
the chunk's own keys), a causal mask on the chunk's own keys, the float32 softmax, then V.
Same machine, 256 new tokens, two threads: 452 against 897 us a layer for the fused SDPA
(whose CPU kernel is slow for GQA), 278 against 601 for 64 tokens after 512 cached; a
whole 256-token prefill of SmolLM2 103 -> 100 ms, 512 tokens 250 -> 218 ms. The scores,
megabytes, live in buffers reused by every chunk and layer. A sliding window, or a context
so long that 16 rows' scores would not fit the score budget, goes to the fused SDPA, which
tiles its scores. No KV head is expanded in any path.
`tandem.kernels.reference.attention_ref` is the plain-math oracle the tests hold this to.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from tandem.engine.attention.backend import AttentionBackend, CommonAttentionMetadata
from tandem.engine.attention.matmul_prefill import MatmulPrefill
from tandem.kernels.reference import gather_kv_by_head, gather_kv_ref

# A prefill chunk attends by matmuls when at least MIN_PREFILL_ROWS query rows' float32
# scores fit the score budget; else (very long contexts) by SDPA, which tiles its scores.
MIN_PREFILL_ROWS = 16


@dataclass(frozen=True)
class KVWrites:
    """Where a step's new K/V go, worked out once for every layer: token rows `rows` (None:
    all of them, in order) to slot `offsets` of blocks `blocks`."""

    rows: torch.Tensor | None  # [W] int64
    blocks: torch.Tensor  # [W] int64
    offsets: torch.Tensor  # [W] int64

    @classmethod
    def of(cls, slot_mapping: np.ndarray, block_size: int, device: torch.device) -> KVWrites:
        """From the step's slots (negative: not written)."""
        keep = np.flatnonzero(slot_mapping >= 0)
        rows = None if len(keep) == len(slot_mapping) else torch.from_numpy(keep).to(device)
        slots = slot_mapping[keep]
        return cls(
            rows,
            torch.from_numpy(slots // block_size).to(device),
            torch.from_numpy(slots % block_size).to(device),
        )

    def write(
        self,
        key: torch.Tensor,  # [T, Hkv, D]
        value: torch.Tensor,  # [T, Hkv, D]
        kv_layer: torch.Tensor,  # [N, 2, bs, Hkv, D], written in place
    ) -> None:
        if self.rows is not None:
            key, value = key[self.rows], value[self.rows]
        kv_layer[self.blocks, 0, self.offsets] = key.to(kv_layer.dtype)
        kv_layer[self.blocks, 1, self.offsets] = value.to(kv_layer.dtype)


@dataclass(frozen=True)
class DecodeGroup:
    # [Bg] int64: rows of the flat batch; None when the group is rows 0..Bg-1 in order
    token_idx: torch.Tensor | None
    block_tables: torch.Tensor  # [Bg, MBg] int
    # additive, 0 where key j < seq_len, else -inf. `batched`: [Bg, 1, MBg * bs] float32 for
    # the matmuls; else [Bg, 1, 1, MBg * bs] in the queries' dtype for SDPA
    mask: torch.Tensor
    batched: bool


@dataclass(frozen=True)
class PrefillSlice:
    start: int
    end: int
    block_table: torch.Tensor  # [1, num_blocks] int
    seq_len: int  # its keys: a cached prefix, then the chunk's own tokens
    # [Q, num_blocks * bs] additive (0 or -inf), causal and bottom-right aligned (and
    # windowed); None when the chunk is the whole context and no window applies: K/V come
    # straight from the step.
    mask: torch.Tensor | None


@dataclass(frozen=True)
class TorchAttentionMetadata:
    writes: KVWrites
    decodes: tuple[DecodeGroup, ...]
    prefills: tuple[PrefillSlice, ...]


class TorchAttentionBackend(AttentionBackend):
    def __init__(
        self,
        block_size: int,
        decode_group_size: int = 16,
        *,
        sliding_window: int = 0,
        dtype: torch.dtype = torch.float32,
        batched_from: int = 8,
        by_sequence_heads: int = 16,
        prefill_rows: int = 256,
        score_budget: int = 1 << 21,
        num_heads: int | None = None,
    ) -> None:
        """`sliding_window` W > 0: a query at position p sees keys p - W + 1 .. p. `dtype`:
        the queries' dtype, in which the masks are built once per step (SDPA would otherwise
        turn a boolean mask into an additive one in every layer). A decode group of
        `batched_from` sequences or more attends by batched matmuls, a smaller one by SDPA
        (at 4 sequences the two cost the same with one thread, SDPA 10% less with two).
        Models of at most `by_sequence_heads` query heads (per rank) get their matmuls'
        operands by sequence, larger ones by head (0: always by head). A prefill chunk
        attends by matmuls `prefill_rows` queries at a time, each time at most
        `score_budget` float32 scores (8 MiB); SDPA takes it when fewer than 16 rows fit.
        `num_heads`: the query heads of a rank, which tell `build` the chunks SDPA will take,
        the only ones that need a mask after a cached prefix (None: every such chunk gets
        one, the layers passing queries of any head count)."""
        self.block_size = block_size
        self.decode_group_size = decode_group_size
        self.batched_from = batched_from
        self.by_sequence_heads = by_sequence_heads
        self.score_budget = score_budget
        self.num_heads = num_heads
        self._diagonals: dict[tuple[int, torch.dtype, torch.device], torch.Tensor] = {}
        self._by_matmul = MatmulPrefill(prefill_rows)
        self.sliding_window = sliding_window
        self.dtype = dtype
        # Reused by every gather: fresh multi-MiB outputs each layer would cost page faults.
        self._workspace = torch.empty(0)

    def build(self, common: CommonAttentionMetadata) -> TorchAttentionMetadata:
        query_lens = np.diff(common.query_start_loc_cpu)
        device = common.slot_mapping.device
        decode = np.flatnonzero(query_lens == 1)
        decode = decode[np.argsort(common.seq_lens_cpu[decode], kind="stable")]
        size = self.decode_group_size
        groups = [decode[i : i + size] for i in range(0, len(decode), size)]
        slots = common.slot_mapping.cpu().numpy()  # a host copy: no-op on the CPU
        return TorchAttentionMetadata(
            writes=KVWrites.of(slots, self.block_size, device),
            decodes=tuple(self._decode_group(common, g, device) for g in groups),
            prefills=tuple(
                self._prefill_slice(common, int(b), device) for b in np.flatnonzero(query_lens > 1)
            ),
        )

    def _decode_group(
        self, common: CommonAttentionMetadata, rows: np.ndarray, device: torch.device
    ) -> DecodeGroup:
        seq_lens = common.seq_lens_cpu[rows]
        num_blocks = -(-int(seq_lens.max()) // self.block_size)
        tables = np.ascontiguousarray(common.block_tables_cpu[rows, :num_blocks])
        token_idx = common.query_start_loc_cpu[rows].astype(np.int64)
        in_order = np.array_equal(token_idx, np.arange(len(rows)))
        keys = np.arange(num_blocks * self.block_size)
        mask = keys < seq_lens[:, None]
        if self.sliding_window:
            mask &= keys >= seq_lens[:, None] - self.sliding_window
        batched = len(rows) >= self.batched_from
        if batched:
            additive = np.where(mask, np.float32(0), np.float32(-np.inf))[:, None]
            mask = torch.from_numpy(additive).to(device)
        else:
            mask = self._additive(mask[:, None, None], device)
        return DecodeGroup(
            token_idx=None if in_order else torch.from_numpy(token_idx).to(device),
            block_tables=torch.from_numpy(tables).to(device),
            mask=mask,
            batched=batched,
        )

    def _prefill_slice(
        self, common: CommonAttentionMetadata, b: int, device: torch.device
    ) -> PrefillSlice:
        start, end = int(common.query_start_loc_cpu[b]), int(common.query_start_loc_cpu[b + 1])
        seq_len = int(common.seq_lens_cpu[b])
        num_blocks = -(-seq_len // self.block_size)
        table = common.block_tables_cpu[b : b + 1, :num_blocks]
        mask = None
        sdpa = self.num_heads is None or not self._matmul_rows(self.num_heads, seq_len)
        if (seq_len > end - start or self.sliding_window) and sdpa:  # SDPA's explicit mask
            positions = np.arange(seq_len - (end - start), seq_len)
            keys = np.arange(num_blocks * self.block_size)
            visible = keys <= positions[:, None]
            if self.sliding_window:
                visible &= keys > positions[:, None] - self.sliding_window
            mask = self._additive(visible, device)
        return PrefillSlice(
            start=start,
            end=end,
            block_table=torch.from_numpy(np.ascontiguousarray(table)).to(device),
            seq_len=seq_len,
            mask=mask,
        )

    def _additive(self, visible: np.ndarray, device: torch.device) -> torch.Tensor:
        """0 where `visible`, -inf elsewhere. Every query sees at least one key (itself),
        so no row is all -inf."""
        mask = np.where(visible, np.float32(0), np.float32(-np.inf))
        return torch.from_numpy(mask).to(device=device, dtype=self.dtype)

    def forward(
        self,
        query: torch.Tensor,  # [T, Hq, D]
        key: torch.Tensor,  # [T, Hkv, D]
        value: torch.Tensor,  # [T, Hkv, D]
        kv_layer: torch.Tensor,  # [N, 2, bs, Hkv, D]
        metadata: TorchAttentionMetadata,
        scale: float,
    ) -> torch.Tensor:  # [T, Hq, D]
        metadata.writes.write(key, value, kv_layer)
        out = torch.empty_like(query)
        num_kv_heads, head_dim = key.shape[1], key.shape[2]
        group = query.shape[1] // num_kv_heads
        for g in metadata.decodes:
            rows = slice(0, len(g.block_tables)) if g.token_idx is None else g.token_idx
            q = query[rows].view(-1, num_kv_heads, group, head_dim)  # [Bg, Hkv, G, D]
            o = self._decode(q, kv_layer, g, scale)  # [Bg, Hkv, G, D]
            out[rows] = o.reshape(-1, num_kv_heads * group, head_dim)
        for p in metadata.prefills:
            self._prefill(query[p.start : p.end], key, value, kv_layer, p, scale, out)
        return out

    def _prefill(
        self,
        q: torch.Tensor,  # [Q, Hq, D]
        key: torch.Tensor,  # [T, Hkv, D]: the step's
        value: torch.Tensor,  # [T, Hkv, D]
        kv_layer: torch.Tensor,  # [N, 2, bs, Hkv, D]
        p: PrefillSlice,
        scale: float,
        out: torch.Tensor,  # [T, Hq, D]: the chunk's rows written
    ) -> None:
        """One prefill chunk: by matmuls in chunks of query rows while a chunk's scores fit
        the budget and no window applies; else the fused SDPA, which tiles its scores."""
        whole = p.seq_len == p.end - p.start  # no cached prefix: K/V straight from the step
        if whole:
            k, v = key[p.start : p.end], value[p.start : p.end]  # [S, Hkv, D]
        else:
            k, v = (t[0, : p.seq_len] for t in self._gather(kv_layer, p.block_table))
        if rows := self._matmul_rows(q.shape[1], p.seq_len):
            self._by_matmul(q, k, v, rows, scale, out[p.start : p.end])
            return
        if p.mask is None and (not whole or self.sliding_window):
            raise ValueError(f"a backend built for {self.num_heads} heads got {q.shape[1]}")
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None],
            k.transpose(0, 1)[None],
            v.transpose(0, 1)[None],
            attn_mask=None if p.mask is None else p.mask[:, : p.seq_len],
            is_causal=p.mask is None,
            scale=scale,
            enable_gqa=q.shape[1] > k.shape[1],
        )  # [1, Hq, Q, D]
        out[p.start : p.end] = o[0].transpose(0, 1)

    def _matmul_rows(self, num_heads: int, seq_len: int) -> int:
        """Query rows a time for a prefill chunk over `seq_len` keys by matmuls (those whose
        scores fit the budget, at most the causal mask's size); 0: it goes to SDPA (a sliding
        window, or fewer than MIN_PREFILL_ROWS rows fit)."""
        fit = self.score_budget // (num_heads * seq_len)
        if self.sliding_window or fit < MIN_PREFILL_ROWS:
            return 0
        return min(fit, self._by_matmul.max_rows)

    def _decode(
        self,
        q: torch.Tensor,  # [Bg, Hkv, G, D]
        kv_layer: torch.Tensor,  # [N, 2, bs, Hkv, D]
        g: DecodeGroup,
        scale: float,
    ) -> torch.Tensor:  # [Bg, Hkv, G, D]
        """Batched matmuls for a large group; fused SDPA for a small one, where the matmuls'
        extra small ops cost more than SDPA's per-head overhead saves."""
        if not g.batched:
            k, v = self._gather(kv_layer, g.block_tables)  # [Bg, S, Hkv, D]
            return F.scaled_dot_product_attention(
                q, k.transpose(1, 2), v.transpose(1, 2), attn_mask=g.mask, scale=scale
            )
        if q.shape[1] * q.shape[2] <= self.by_sequence_heads:
            return self._decode_by_sequence(q, kv_layer, g, scale)
        return self._decode_by_head(q, kv_layer, g, scale)

    def _decode_by_sequence(
        self,
        q: torch.Tensor,  # [Bg, Hkv, G, D]
        kv_layer: torch.Tensor,  # [N, 2, bs, Hkv, D]
        g: DecodeGroup,
        scale: float,
    ) -> torch.Tensor:  # [Bg, Hkv, G, D]
        """Every query head of a sequence against all of its K at once, through a
        block-diagonal query (the module's docstring)."""
        k, v = self._gather(kv_layer, g.block_tables)  # [Bg, S, Hkv, D]
        num_seqs, num_keys, num_kv_heads, head_dim = k.shape
        group = q.shape[2]
        diagonal = self._diagonal(num_kv_heads, q)  # [Hkv, 1, Hkv, 1]
        rows = (q[:, :, :, None] * diagonal).view(num_seqs, -1, num_kv_heads * head_dim)
        keys = k.view(num_seqs, num_keys, -1).transpose(1, 2)  # [Bg, Hkv * D, S]
        scores = torch.bmm(rows, keys).float().mul_(scale).add_(g.mask)  # [Bg, Hq, S]
        probs = torch.softmax(scores, dim=-1).to(q.dtype)
        o = torch.bmm(probs, v.view(num_seqs, num_keys, -1))  # [Bg, Hq, Hkv * D]
        o = o.view(num_seqs, num_kv_heads, group, num_kv_heads, head_dim)
        return torch.diagonal(o, dim1=1, dim2=3).permute(0, 3, 1, 2)  # head h's D columns

    def _diagonal(self, num_kv_heads: int, like: torch.Tensor) -> torch.Tensor:
        """[Hkv, 1, Hkv, 1]: 1 where the two KV heads are the same, else 0 (made once)."""
        key = (num_kv_heads, like.dtype, like.device)
        if key not in self._diagonals:
            eye = torch.eye(num_kv_heads, dtype=like.dtype, device=like.device)
            self._diagonals[key] = eye[:, None, :, None]
        return self._diagonals[key]

    def _decode_by_head(
        self,
        q: torch.Tensor,  # [Bg, Hkv, G, D]
        kv_layer: torch.Tensor,  # [N, 2, bs, Hkv, D]
        g: DecodeGroup,
        scale: float,
    ) -> torch.Tensor:  # [Bg, Hkv, G, D]
        """The GQA group of each KV head against that head's K, gathered head-major."""
        k, v = gather_kv_by_head(
            kv_layer, g.block_tables, self._workspace_for(kv_layer, g.block_tables)
        )
        num_kv_heads, num_seqs, num_keys, head_dim = k.shape
        group = q.shape[2]
        q = q.transpose(0, 1).reshape(num_kv_heads * num_seqs, group, head_dim)
        scores = torch.bmm(q, k.view(-1, num_keys, head_dim).transpose(1, 2)).float()
        scores = scores.view(num_kv_heads, num_seqs, group, num_keys).mul_(scale).add_(g.mask)
        probs = torch.softmax(scores, dim=-1).to(q.dtype)  # [Hkv, Bg, G, S]
        o = torch.bmm(probs.view(-1, group, num_keys), v.view(-1, num_keys, head_dim))
        return o.view(num_kv_heads, num_seqs, group, head_dim).transpose(0, 1)

    def _gather(
        self,
        kv_layer: torch.Tensor,  # [N, 2, bs, Hkv, D]
        block_tables: torch.Tensor,  # [B, MB]
    ) -> tuple[torch.Tensor, torch.Tensor]:  # two [B, MB * bs, Hkv, D] views of the workspace
        return gather_kv_ref(kv_layer, block_tables, self._workspace_for(kv_layer, block_tables))

    def _workspace_for(self, kv_layer: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
        """The reused gather buffer, grown (doubling) to hold K and V of `block_tables`."""
        needed = 2 * block_tables.numel() * kv_layer[0, 0].numel()
        ws = self._workspace
        if ws.numel() < needed or ws.dtype != kv_layer.dtype or ws.device != kv_layer.device:
            size = max(needed, 2 * ws.numel() if ws.dtype == kv_layer.dtype else 0)
            self._workspace = ws = torch.empty(size, dtype=kv_layer.dtype, device=kv_layer.device)
        return ws
