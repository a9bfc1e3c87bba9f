"""Llama-family model definitions."""
