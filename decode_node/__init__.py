"""Decode service: reserves blocks, asks prefill, continuous-batched decode (issue 3)."""
