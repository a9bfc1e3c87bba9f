"""Linear weights prepacked for oneDNN on the CPU: the matmul's blocked layout made once at
load instead of on every call.

A decode step on the CPU is bound by reading the weights from memory; `F.linear` reorders a
plain [out, in] weight into oneDNN's blocked layout on each call, which reads it twice. A
prepacked weight is read once: measured on an AVX512-BF16 EPYC, one thread, weights not in
cache, 1.3-1.5x faster per projection in bfloat16 and 1.1-1.2x in float32 (see
`docs/performance.md`). Inductor's CPU freezing pass does the same.

`prepack_linears(model)` gives every linear layer (and the LM head) a `prepacked` copy and
frees the plain weight of the projections (the embedding keeps its own: a tied LM head is
a prepacked copy of it). `linear(x, weight, bias, prepacked)` uses whichever the layer has.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

PREPACK_DTYPES = (torch.float32, torch.bfloat16)


def can_prepack(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether weights of `dtype` on `device` can be prepacked (oneDNN, CPU)."""
    return device.type == "cpu" and torch.backends.mkldnn.is_available() and dtype in PREPACK_DTYPES


def prepack(weight: torch.Tensor) -> torch.Tensor:
    """[out, in] -> the same matrix in oneDNN's blocked layout (an opaque mkldnn tensor)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1)


def linear(
    x: torch.Tensor,  # [T, in]
    weight: torch.Tensor,  # [out, in]; empty once prepacked
    bias: torch.Tensor | None,  # [out]
    prepacked: torch.Tensor | None,
) -> torch.Tensor:  # [T, out]
    if prepacked is None:
        return F.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, prepacked, bias, "none", [], "")


def prepack_linears(model: nn.Module) -> int:
    """Prepack every module that declares a `prepacked` slot; the projections' plain weights
    are freed (`keeps_weight` modules, the embedding, keep theirs). Returns how many."""
    count = 0
    for module in model.modules():
        if not hasattr(module, "prepacked") or module.prepacked is not None:
            continue
        module.prepacked = prepack(module.weight)
        if not getattr(module, "keeps_weight", False):
            module.weight.data = torch.empty(0, dtype=module.weight.dtype)
        count += 1
    return count


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the weights `model` holds: its parameters, and the prepacked copies of those
    freed."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for module in model.modules():
        packed = getattr(module, "prepacked", None)
        if packed is not None:
            total += packed.numel() * packed.element_size()
    return total
