"""Causal attention of one prefill chunk by batched matmuls on the CPU, a few hundred query
rows at a time, for the torch backend (`torch_backend.py` says when and why: torch's fused
CPU SDPA is slow for GQA).

Each KV head's GQA group of query heads is one [rows * G, D] matrix against that head's K
(a cached prefix, then the chunk's own keys, causally masked); scores and softmax in
float32. The scores live in three buffers reused by every chunk and layer: megabytes made
and freed in every layer would take fresh pages from the C heap each time under glibc's
defaults (2.4x slower at 256 tokens, measured).
"""

from __future__ import annotations

import math

import torch


class MatmulPrefill:
    """Owns the reused score buffers and the causal mask of one row chunk."""

    def __init__(self, max_rows: int = 256) -> None:
        """`max_rows`: the most query rows a chunk may have (the causal mask's size)."""
        self.max_rows = max_rows
        self._causal_masks: dict[torch.device, torch.Tensor] = {}
        self._scores: tuple[torch.Tensor, ...] = ()

    def __call__(
        self,
        q: torch.Tensor,  # [Q, Hq, D]
        k: torch.Tensor,  # [S, Hkv, D]: a cached prefix of S - Q keys, then the chunk's own
        v: torch.Tensor,  # [S, Hkv, D]
        rows: int,
        scale: float,
        out: torch.Tensor,  # [Q, Hq, D], written
    ) -> None:
        """Causal attention `rows` (<= max_rows) queries at a time, into `out`."""
        num_queries, num_heads, head_dim = q.shape
        num_keys, num_kv_heads = k.shape[0], k.shape[1]
        group = num_heads // num_kv_heads
        prefix = num_keys - num_queries
        keys = k.transpose(0, 1).contiguous().transpose(1, 2)  # [Hkv, D, S]
        values = v.transpose(0, 1).contiguous()  # [Hkv, S, D]
        causal = self._causal(q.device)  # [max_rows, max_rows]
        for start in range(0, num_queries, rows):
            n = min(rows, num_queries - start)
            seen = prefix + start + n  # keys the chunk's last query sees
            chunk = q[start : start + n].view(n, num_kv_heads, group, head_dim).transpose(0, 1)
            chunk = chunk.reshape(num_kv_heads, n * group, head_dim)  # rows (token, head)
            shape = (num_kv_heads, n * group, seen)
            low, scores, probs = (b.view(shape) for b in self._score_space(q, math.prod(shape)))
            torch.bmm(chunk, keys[:, :, :seen], out=low)
            torch.mul(low, scale, out=scores)  # float32 from here
            mine = scores.view(num_kv_heads, n, group, seen)[..., prefix + start :]
            mine.add_(causal[:n, None, :n])  # the chunk's own keys, causally
            torch.ops.aten._softmax.out(scores, -1, False, out=probs)
            low.copy_(probs)
            o = torch.bmm(low, values[:, :seen])  # [Hkv, n * G, D]
            out[start : start + n].view(n, num_kv_heads, group, head_dim).copy_(
                o.view(num_kv_heads, n, group, head_dim).transpose(0, 1)
            )

    def _score_space(self, like: torch.Tensor, size: int) -> tuple[torch.Tensor, ...]:
        """Three flat buffers of `size` elements: scores in the queries' dtype (then the
        probabilities), scores and probabilities in float32; grown, never shrunk."""
        space = self._scores
        if not space or space[0].numel() < size or space[0].dtype != like.dtype:
            space = (like.new_empty(size), like.new_empty(size, dtype=torch.float32))
            self._scores = space = (*space, like.new_empty(size, dtype=torch.float32))
        return tuple(b[:size] for b in space)

    def _causal(self, device: torch.device) -> torch.Tensor:
        """[max_rows, max_rows] float32: 0 on and below the diagonal, -inf above (made once
        per device)."""
        if device not in self._causal_masks:
            size = (self.max_rows, self.max_rows)
            mask = torch.full(size, float("-inf"), device=device)
            self._causal_masks[device] = mask.triu(1)
        return self._causal_masks[device]
