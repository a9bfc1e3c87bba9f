"""Compute kernels: each Triton kernel sits beside its plain-torch reference (the CPU path)."""
