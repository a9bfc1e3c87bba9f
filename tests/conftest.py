"""Shared fixtures: small random checkpoints, written once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tandem.engine.tiny_model import ARCHS, make_model

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {arch: make_model(root / arch, arch=arch, seed=i) for i, arch in enumerate(ARCHS)}


@pytest.fixture(scope="session")
def llama_dir(model_dirs) -> Path:
    return model_dirs["llama"]


@pytest.fixture(scope="session")
def llm(llama_dir):
    """A shared engine for API tests; tests must leave it with no request in flight."""
    from tandem.engine import LLM

    return LLM(str(llama_dir), num_kv_blocks=64, max_num_batched_tokens=128, max_num_seqs=16)


@pytest.fixture(scope="session")
def tokenizer(llama_dir):
    from tandem.engine.tokenizer import load_tokenizer

    return load_tokenizer(llama_dir)
