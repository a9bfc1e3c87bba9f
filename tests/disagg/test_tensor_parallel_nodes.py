"""Nodes with `--tensor-parallel-size`: a decode node of two ranks serves what the offline
engine gives, prefilling every prompt itself (KV transfer is from one rank's cache, so it
never asks the prefill worker the router names); a prefill node or `tandem serve` asked for
more than one prefill rank refuses to start, naming why."""

from __future__ import annotations

import subprocess
import sys

from tests.bounds import PROCESS_S
from tests.disagg.nodes import Node, assert_clean, generate, metric_value, running
from tests.disagg.test_disagg import assert_matches_offline, workload

NUM_REQUESTS = 6


def test_a_two_rank_decode_node_prefills_locally_and_matches_offline(llama_dir, node_logs, llm):
    decode = Node(
        "decode", llama_dir, node_logs, "--tensor-parallel-size", "2",
        "--max-num-batched-tokens", "64", "--max-model-len", "512", "--num-kv-blocks", "64",
    )  # fmt: skip
    never_started = Node("prefill", llama_dir, node_logs)  # named, never asked
    items = workload(21, NUM_REQUESTS)
    with running({"d": decode}):
        got = [
            generate(decode, f"tp{i}", prompt, sampling, never_started)[0]
            for i, (prompt, sampling) in enumerate(items)
        ]
        metrics = decode.metrics()
        assert metric_value(metrics, "tandem_disagg_decisions_total", decision="local") == len(
            items
        )
        assert metric_value(metrics, "tandem_disagg_decisions_total", decision="remote") == 0
        assert metric_value(metrics, "tandem_prefill_fallbacks_total") == 0
        assert_clean(decode)
    assert_matches_offline(llm, items, got)


def _refused(*command: str) -> str:
    result = subprocess.run(
        [sys.executable, "-P", "-m", "tandem.engine.cli", *command],
        capture_output=True,
        text=True,
        timeout=PROCESS_S,
        check=False,
    )
    assert result.returncode != 0, result.stdout
    return result.stderr


def test_a_prefill_node_of_two_ranks_refuses_to_start(llama_dir):
    err = _refused(
        "prefill", "--model", str(llama_dir), "--http-port", "1", "--zmq-port", "1",
        "--tensor-parallel-size", "2",
    )  # fmt: skip
    assert "tandem prefill: KV transfer between prefill and decode nodes is per node" in err
    assert "--tensor-parallel-size above 1" in err


def test_serve_refuses_ranks_beside_prefill_nodes(llama_dir):
    for role in ("prefill", "decode"):
        err = _refused("serve", "--model", str(llama_dir), f"--{role}-tensor-parallel-size", "2")
        assert f"--{role}-tensor-parallel-size above 1" in err and "--prefill 0" in err
    err = _refused("serve", "--model", str(llama_dir), "--decode-tensor-parallel-size", "0")
    assert "--decode-tensor-parallel-size must be at least 1" in err
