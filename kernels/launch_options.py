"""Compile options that every Tandem kernel launch passes explicitly.

Triton 3.9 fuses multiplies and adds into FMAs unless told otherwise, warns that its default
changes in 3.10, and reads `TRITON_DEFAULT_FP_FUSION` from the environment when a launch
says nothing. Passing the option pins what our kernels compile to across Triton versions and
environments. The interpreter ignores it.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Final

LAUNCH_OPTIONS: Final = MappingProxyType({"enable_fp_fusion": True})
