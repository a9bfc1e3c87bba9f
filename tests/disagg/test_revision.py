"""A node labelled with a model revision caches its blocks under hashes that include it
(design §4): the real process, from the `--revision` flag to `/debug/blocks`."""

from __future__ import annotations

import httpx

from tandem.engine.core.block_hash import hash_blocks
from tests.disagg.nodes import Node, assert_clean, generate, running


def test_a_labelled_node_publishes_its_blocks_under_its_revision(llama_dir, node_logs):
    node = Node("decode", llama_dir, node_logs, "--max-model-len", "512", "--revision", "r7")
    with running({"d": node}):
        prompt = list(range(5, 75))  # 4 full blocks of 16
        _, _, last = generate(node, "rev", prompt, {"max_tokens": 2, "temperature": 0})
        assert last["finish_reason"] == "length", last
        labelled, plain = hash_blocks(prompt, 16, ("r7",)), hash_blocks(prompt, 16)
        r = httpx.post(f"{node.url}/debug/blocks", json={"hashes": labelled + plain}, timeout=60)
        assert {int(h) for h in r.json()} == set(labelled)
        assert node.wait_ready()["revision"] == "r7"
        assert_clean(node)
