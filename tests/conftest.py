"""Shared fixtures: small random checkpoints, written once per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tandem.engine.tiny_model import ARCHS, make_model

torch.set_num_threads(1)
if not torch.cuda.is_available():
    # Triton kernels run on the CPU through Triton's interpreter. Read when a kernel module
    # is imported, so set before any test imports one.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items) -> None:
    """`gpu` tests need CUDA; selected explicitly (`make test-gpu`) without one, they skip
    with that reason rather than fail on a missing device."""
    if torch.cuda.is_available():
        return
    no_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(no_gpu)


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {arch: make_model(root / arch, arch=arch, seed=i) for i, arch in enumerate(ARCHS)}


@pytest.fixture(scope="session")
def llama_dir(model_dirs) -> Path:
    return model_dirs["llama"]


@pytest.fixture(scope="session")
def llm(llama_dir):
    """A shared engine for API tests; tests must leave it with no request in flight. float32,
    as every engine the tests compare outputs of: their tolerances are float32's, and `auto`
    is bfloat16 on some CPUs and float32 on others."""
    from tandem.engine import LLM

    return LLM(
        str(llama_dir),
        dtype="float32",
        num_kv_blocks=64,
        max_num_batched_tokens=128,
        max_num_seqs=16,
    )


@pytest.fixture(scope="session")
def tokenizer(llama_dir):
    from tandem.engine.tokenizer import load_tokenizer

    return load_tokenizer(llama_dir)


NR_HUGEPAGES = Path("/proc/sys/vm/nr_hugepages")


@pytest.fixture
def free_hugepages():
    """`ensure(n)`: at least `n` huge pages free, the kernel's reservation raised for this
    test alone when it falls short (root only) and put back afterwards."""
    from tandem.engine.exec.host_memory import free_huge_pages

    before = int(NR_HUGEPAGES.read_text())

    def ensure(n: int) -> None:
        short = n - free_huge_pages()
        if short <= 0:
            return
        try:
            NR_HUGEPAGES.write_text(str(int(NR_HUGEPAGES.read_text()) + short))
        except OSError:
            pytest.skip(f"needs {n} free huge pages, or root to reserve them")
        if free_huge_pages() < n:
            pytest.skip(f"the kernel found memory for only {free_huge_pages()} huge pages")

    yield ensure
    if int(NR_HUGEPAGES.read_text()) != before:
        NR_HUGEPAGES.write_text(str(before))
