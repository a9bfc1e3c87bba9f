"""Building blocks shared by the Llama family: norms, rotary embedding, fused linears."""

from __future__ import annotations

import math

import torch
from torch import nn

from tandem.engine.core.config import RopeScaling
from tandem.kernels.ops import KernelOps


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float, ops: KernelOps) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self.ops = ops

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """[T, H] -> [T, H]; with `residual`, returns (norm(x + residual), x + residual)."""
        return self.ops.rms_norm(x, self.weight, self.eps, residual)


class RotaryEmbedding(nn.Module):
    """Neox-style rotary embedding over a precomputed [max_pos, D] cos|sin table."""

    def __init__(
        self,
        head_dim: int,
        max_position: int,
        theta: float,
        scaling: RopeScaling | None,
        ops: KernelOps,
    ) -> None:
        super().__init__()
        self.ops = ops
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        if scaling is not None:
            inv_freq = llama3_scale_inv_freq(inv_freq, scaling)
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
        cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1)  # [max_pos, D]
        self.register_buffer("cos_sin_cache", cache, persistent=False)

    def _apply(self, fn, recurse=True):  # nn.Module's signature
        """Moves with the model but stays float32 whatever the model's dtype: cos and sin
        of large positions need float32's precision (the Triton kernel requires it)."""
        super()._apply(fn, recurse)
        self.cos_sin_cache = self.cos_sin_cache.float()
        return self

    def prepare(self, positions: torch.Tensor) -> object:
        """positions [T] -> the step's rotary input, made once for every layer (the kernel
        set's `rotary_input`: the positions, or cos and sin tables)."""
        return self.ops.rotary_input(positions, self.cos_sin_cache)

    def forward(
        self, rotation: object, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotated (query [T, Hq, D], key [T, Hkv, D]) by `prepare`'s `rotation`; the
        inputs may be rotated in place."""
        return self.ops.rotary(rotation, query, key, self.cos_sin_cache)


def llama3_scale_inv_freq(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    """Llama 3.1's rope scaling: long wavelengths slowed by `factor`, short ones kept, and a
    smooth blend between."""
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    blended = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, blended, scaled)
