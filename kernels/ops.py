"""The elementwise kernels a model calls, as one set chosen per engine: the plain-torch
references (the CPU path) or the Triton kernels (CUDA, or the CPU under TRITON_INTERPRET=1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tandem.kernels.reference import rms_norm_ref, rotary_ref, silu_and_mul_ref


@dataclass(frozen=True)
class KernelOps:
    """Same signatures as the references in `tandem.kernels.reference`; `rotary` may rotate
    its inputs in place and returns the rotated pair."""

    name: str
    rms_norm: Callable
    rotary: Callable
    silu_and_mul: Callable


TORCH_OPS = KernelOps("torch", rms_norm_ref, rotary_ref, silu_and_mul_ref)


def triton_ops() -> KernelOps:
    """The Triton kernels; imported here so that the torch path never needs Triton."""
    from tandem.kernels.activation import silu_and_mul
    from tandem.kernels.rms_norm import rms_norm
    from tandem.kernels.rotary import rotary

    return KernelOps("triton", rms_norm, rotary, silu_and_mul)


def kernel_ops(name: str) -> KernelOps:
    """`torch` or `triton`."""
    if name == "torch":
        return TORCH_OPS
    if name == "triton":
        return triton_ops()
    raise ValueError(f"unknown kernel backend {name!r}; use torch or triton")
