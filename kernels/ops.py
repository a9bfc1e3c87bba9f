"""The elementwise kernels a model calls, as one set chosen per engine: the plain-torch
references (the CPU path) or the Triton kernels (CUDA, or the CPU under TRITON_INTERPRET=1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from tandem.kernels.reference import rms_norm_ref, silu_and_mul_ref
from tandem.kernels.rotary_tables import rotary_by_tables, rotary_tables


@dataclass(frozen=True)
class KernelOps:
    """Same signatures as the references in `tandem.kernels.reference`, but for the rotary:
    `rotary_input(positions, cos_sin_cache)` runs once a step and makes what `rotary` then
    takes in place of the positions in every layer (the positions themselves for the Triton
    kernel, cos and sin tables for torch). `rotary` may rotate its inputs in place and
    returns the rotated pair."""

    name: str
    rms_norm: Callable
    rotary_input: Callable
    rotary: Callable
    silu_and_mul: Callable


def positions_as_given(positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> torch.Tensor:
    """The Triton kernel's rotary input: it looks each position up itself."""
    return positions


TORCH_OPS = KernelOps("torch", rms_norm_ref, rotary_tables, rotary_by_tables, silu_and_mul_ref)


def triton_ops() -> KernelOps:
    """The Triton kernels; imported here so that the torch path never needs Triton."""
    from tandem.kernels.activation import silu_and_mul
    from tandem.kernels.rms_norm import rms_norm
    from tandem.kernels.rotary import rotary

    return KernelOps("triton", rms_norm, positions_as_given, rotary, silu_and_mul)


def kernel_ops(name: str) -> KernelOps:
    """`torch` or `triton`."""
    if name == "torch":
        return TORCH_OPS
    if name == "triton":
        return triton_ops()
    raise ValueError(f"unknown kernel backend {name!r}; use torch or triton")
