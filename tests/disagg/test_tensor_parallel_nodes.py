"""Prefill and decode nodes of different tensor-parallel sizes, real processes: each rank's
KV heads go over NIXL straight to the decode rank(s) holding them (1 -> 2, 2 -> 1, 2 -> 2),
outputs equal the offline engine's, and no block or write is left on any rank; a prefill
rank killed mid-request is a dead prefill node."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading

import pytest

from tests.bounds import HANG_S, PROCESS_S
from tests.disagg.nodes import (
    Node,
    assert_clean,
    connect,
    generate,
    metric_value,
    running,
    wait_until,
)
from tests.disagg.test_disagg import assert_matches_offline, run_concurrently, workload

NUM_REQUESTS = 8
COMMON = ("--max-num-batched-tokens", "64", "--max-model-len", "512", "--num-kv-blocks", "96")
PATIENT = ("--prefill-timeout", "600", "--hold-timeout", "600")


@pytest.fixture(scope="module")
def tp_nodes(llama_dir, node_logs):
    tp2 = ("--tensor-parallel-size", "2")
    nodes = {
        "p1": Node("prefill", llama_dir, node_logs, *COMMON),
        "p2": Node("prefill", llama_dir, node_logs, *COMMON, *tp2),
        "d1": Node("decode", llama_dir, node_logs, *COMMON, *PATIENT),
        "d2": Node("decode", llama_dir, node_logs, *COMMON, *PATIENT, *tp2),
    }
    with running(nodes):
        yield nodes


def assert_no_writes_left(*nodes: Node) -> None:
    for node in nodes:
        assert wait_until(lambda n=node: not any(n.kv()["rank_writes_in_flight"]))


@pytest.mark.parametrize(("prefill", "decode"), [("p1", "d2"), ("p2", "d1"), ("p2", "d2")])
def test_kv_between_tensor_parallel_sizes_matches_offline(tp_nodes, llm, prefill, decode):
    p, d = tp_nodes[prefill], tp_nodes[decode]
    connect(d, p)
    dm = d.metrics()
    before = [
        metric_value(dm, "tandem_disagg_decisions_total", decision="remote"),
        metric_value(dm, "tandem_prefill_fallbacks_total"),
    ]
    items = workload(31, NUM_REQUESTS)
    results = run_concurrently(d, items, p, f"tp-{prefill}-{decode}-")
    assert_matches_offline(llm, items, [tokens for tokens, _, _ in results])
    dm = d.metrics()
    remote = metric_value(dm, "tandem_disagg_decisions_total", decision="remote") - before[0]
    assert remote == NUM_REQUESTS
    assert metric_value(dm, "tandem_prefill_fallbacks_total") == before[1]
    assert_clean(d, p)
    assert_no_writes_left(d, p)
    assert len(p.kv()["rank_writes_in_flight"]) == (2 if prefill == "p2" else 1)


def test_a_prefill_rank_killed_mid_transfer_is_a_dead_prefill_node(llama_dir, node_logs, llm):
    """Decode rank 1 is stopped, so the write prefill rank 1 posts into it cannot complete
    (its agent makes no progress): prefill rank 1 is killed with that write in flight."""
    p = Node("prefill", llama_dir, node_logs, *COMMON, "--tensor-parallel-size", "2")
    hasty = ("--prefill-timeout", "600", "--hold-timeout", "5")
    d = Node("decode", llama_dir, node_logs, *COMMON, *hasty, "--tensor-parallel-size", "2")
    with running({"p": p, "d": d}):
        connect(d, p)
        prompt = [random.Random(5).randrange(5, 500) for _ in range(150)]  # 3 chunks
        greedy = {"max_tokens": 6, "temperature": 0.0, "ignore_eos": True}
        decode_rank1 = d.kv()["rank_pids"][0]
        os.kill(decode_rank1, signal.SIGSTOP)
        result = {}
        thread = threading.Thread(
            target=lambda: result.update(out=generate(d, "rank-killed", prompt, greedy, p))
        )
        thread.start()
        try:
            assert wait_until(lambda: any("#w" in hold for hold in p.kv()["holds"]))
            os.kill(p.kv()["rank_pids"][0], signal.SIGKILL)
            p.proc.wait(HANG_S)  # rank 0 sees its rank gone and the node exits
        finally:
            os.kill(decode_rank1, signal.SIGCONT)
        assert p.proc.returncode != 0
        assert "tensor-parallel rank 1" in p.log_tail()
        thread.join(HANG_S)
        tokens, _, last = result["out"]
        assert last["finish_reason"] == "length"
        assert_matches_offline(llm, [(prompt, greedy)], [tokens])
        dm = d.metrics()
        assert metric_value(dm, "tandem_prefill_fallbacks_total", reason="disconnected") == 1
        assert_clean(d)  # the attempt's blocks came back at the hold timeout
        assert_no_writes_left(d)


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


def test_serve_refuses_a_tensor_parallel_size_below_one(llama_dir):
    err = _refused("serve", "--model", str(llama_dir), "--decode-tensor-parallel-size", "0")
    assert "--decode-tensor-parallel-size must be at least 1" in err
