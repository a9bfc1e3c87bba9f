"""Host tensors on huge pages: the mapping, its errors, and a KV pool on it."""

from __future__ import annotations

import argparse

import pytest
import torch

from tandem.engine import LLM, SamplingParams
from tandem.engine.core.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from tandem.engine.exec.host_memory import free_huge_pages, huge_page_bytes, hugepage_zeros, meminfo
from tandem.node.flags import add_engine_arguments, engine_args_from


def test_meminfo_reads_sizes_in_bytes_and_counts_as_counts(tmp_path):
    path = tmp_path / "meminfo"
    path.write_text("MemTotal:  24000 kB\nHugePages_Free:      7\nHugepagesize:    2048 kB\n")
    assert meminfo("Hugepagesize", path) == 2 << 20
    assert meminfo("HugePages_Free", path) == 7
    with pytest.raises(OSError, match="no 'Hugetlb'"):
        meminfo("Hugetlb", path)


def test_too_few_reserved_pages_is_a_clear_error():
    wanted = free_huge_pages() + 1
    with pytest.raises(OSError, match=r"vm\.nr_hugepages") as err:
        hugepage_zeros((wanted, huge_page_bytes()), torch.uint8)
    assert f"cannot map {wanted} huge pages" in str(err.value)


def test_a_tensor_holds_its_pages_until_its_last_view_is_gone(free_hugepages):
    free_hugepages(3)
    free = free_huge_pages()
    page = huge_page_bytes()
    rows = 2 * page // 16 + 1  # two pages of float32 and 16 bytes
    t = hugepage_zeros((rows, 4), torch.float32)
    assert t.shape == (rows, 4) and t.is_contiguous() and not t.any()
    assert free_huge_pages() == free - 3  # populated at once, rounded up to whole pages
    view = t[1:]
    t[-1] = torch.arange(4.0)
    del t
    assert view[-1].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert free_huge_pages() == free - 3
    del view
    assert free_huge_pages() == free


def test_hugepages_is_for_a_host_cache(llama_dir):
    model = ModelConfig.from_pretrained(llama_dir)
    cache, scheduler = CacheConfig(num_blocks=4, hugepages=True), SchedulerConfig(max_model_len=64)
    assert EngineConfig(str(llama_dir), model, cache, scheduler).cache.hugepages
    with pytest.raises(ValueError, match="kv_hugepages is for a KV cache in host memory"):
        EngineConfig(str(llama_dir), model, cache, scheduler, device=torch.device("cuda"))


def test_an_engine_on_huge_pages_generates_the_same_tokens(llama_dir, llm, free_hugepages):
    prompts = [[5 + (7 * i + j) % 400 for j in range(3 + 29 * i)] for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    kwargs = dict(dtype="float32", num_kv_blocks=64, max_num_batched_tokens=128, max_num_seqs=16)
    free_hugepages(4)
    free = free_huge_pages()
    huge = LLM(str(llama_dir), kv_hugepages=True, **kwargs)
    assert free_huge_pages() < free  # the pool took its pages
    ours = huge.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    want = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in ours] == [o.outputs[0].token_ids for o in want]
    huge.engine.kv.check_integrity()


@pytest.mark.parametrize(
    ("env", "argv", "expected"),
    [(None, [], False), ("1", [], True), ("0", [], False), (None, ["--kv-hugepages"], True)],
)
def test_node_flag_and_its_environment_default(monkeypatch, env, argv, expected):
    if env is None:
        monkeypatch.delenv("TANDEM_KV_HUGEPAGES", raising=False)
    else:
        monkeypatch.setenv("TANDEM_KV_HUGEPAGES", env)
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    args = parser.parse_args(["--model", "m", "--http-port", "1", "--zmq-port", "2", *argv])
    assert engine_args_from(args).kv_hugepages is expected
