"""Prefill and decode nodes whose KV pools sit on huge pages (`--kv-hugepages`)."""

from __future__ import annotations

import pytest

from tandem.engine.engine_args import EngineArgs
from tandem.engine.exec.host_memory import free_huge_pages, huge_page_bytes
from tandem.engine.model_runner import kv_block_bytes
from tests.disagg.nodes import Node, assert_clean, running, wait_until
from tests.disagg.test_disagg import assert_matches_offline, run_concurrently, workload

FLAGS = ("--max-num-batched-tokens", "256", "--max-model-len", "512", "--kv-hugepages")


def test_nodes_on_huge_pages_match_offline_and_give_the_pages_back(
    llama_dir, node_logs, llm, free_hugepages
):
    free_hugepages(4)
    free = free_huge_pages()
    nodes = {
        "p": Node("prefill", llama_dir, node_logs, *FLAGS, "--num-kv-blocks", "128"),
        "d": Node("decode", llama_dir, node_logs, *FLAGS, "--num-kv-blocks", "128"),
    }
    with running(nodes):
        assert free_huge_pages() <= free - 2  # one pool each, at least a page apiece
        items = workload(3, 12)
        results = run_concurrently(nodes["d"], items, nodes["p"], "huge-")
        assert_matches_offline(llm, items, [tokens for tokens, _, _ in results])
        assert_clean(nodes["d"], nodes["p"])
    assert wait_until(lambda: free_huge_pages() == free)


def test_a_node_without_enough_huge_pages_says_so(llama_dir, node_logs):
    block_bytes = kv_block_bytes(EngineArgs(str(llama_dir), num_kv_blocks=1).create_config())
    blocks = (free_huge_pages() + 1) * huge_page_bytes() // block_bytes + 1  # one page short
    node = Node("decode", llama_dir, node_logs, *FLAGS, "--num-kv-blocks", str(blocks))
    with pytest.raises(RuntimeError, match="exited"):
        running({"d": node}).__enter__()
    log = (node_logs / f"decode-{node.http_port}.log").read_text()
    assert "vm.nr_hugepages" in log
