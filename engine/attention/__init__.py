"""Attention backends: the interface the model calls (`backend`) and its torch and Triton
implementations over the paged KV cache."""
