"""OpenAI-compatible router over the prefill and decode pools (arrives with issue 4)."""
