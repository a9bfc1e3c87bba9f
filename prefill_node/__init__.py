"""Prefill service: prompt-only batches, KV blocks pushed over NIXL (arrives with issue 3)."""
