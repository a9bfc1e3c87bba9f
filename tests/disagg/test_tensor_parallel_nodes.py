"""Prefill and decode nodes of different tensor-parallel sizes, real processes: each rank's
KV heads go over NIXL straight to the decode rank(s) holding them (1 -> 2, 2 -> 1, 2 -> 2),
outputs equal the offline engine's, and no block or write is left on any rank; a prefill
rank killed mid-request is a dead prefill node."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

import httpx
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
GREEDY = {"max_tokens": 6, "temperature": 0.0, "ignore_eos": True}
COMMON = ("--max-num-batched-tokens", "64", "--max-model-len", "512", "--num-kv-blocks", "96")
PATIENT = ("--prefill-timeout", "600", "--hold-timeout", "600")


@pytest.fixture(scope="module")
def tp_nodes(llama_dir, node_logs):
    tp2 = ("--tensor-parallel-size", "2")
    peers = ("--peer-tensor-parallel-sizes", "1", "2")  # p1 plans a mirror for d2
    nodes = {
        "p1": Node("prefill", llama_dir, node_logs, *COMMON, *peers),
        "p2": Node("prefill", llama_dir, node_logs, *COMMON, *tp2, *peers),
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


@contextlib.contextmanager
def strangers(llama_dir, node_logs, hold_timeout: str) -> Iterator[tuple[Node, Node]]:
    """A prefill and a decode node of two ranks whose agents have never met. A first write
    between two agents waits for the target's agent to progress (UCX's wire-up), so the
    first write into a stopped decode rank stays in flight until it runs again. The decode
    node's ZMQ connection is warmed with a prompt the prefill node refuses (longer than its
    max model length): it fails over and nothing is written."""
    tp2 = ("--tensor-parallel-size", "2")
    p = Node("prefill", llama_dir, node_logs, "--max-model-len", "32", *tp2)
    hasty = ("--prefill-timeout", "600", "--hold-timeout", hold_timeout)
    d = Node("decode", llama_dir, node_logs, *COMMON, *hasty, *tp2)
    with running({"p": p, "d": d}):
        _, _, last = generate(d, "warm", list(range(5, 45)), GREEDY, p)
        assert last["finish_reason"] == "length"
        assert metric_value(d.metrics(), "tandem_prefill_fallbacks_total", reason="error") == 1
        yield p, d


def writing(p: Node) -> bool:
    return any("#w" in hold for hold in p.kv()["holds"])


def test_a_prefill_rank_killed_mid_transfer_is_a_dead_prefill_node(llama_dir, node_logs, llm):
    """Prefill rank 1 is killed while its write into a stopped decode rank is in flight."""
    with strangers(llama_dir, node_logs, hold_timeout="5") as (p, d):
        prompt = [random.Random(5).randrange(5, 500) for _ in range(30)]
        decode_rank1 = d.kv()["rank_pids"][0]
        os.kill(decode_rank1, signal.SIGSTOP)
        result = {}
        thread = threading.Thread(
            target=lambda: result.update(out=generate(d, "rank-killed", prompt, GREEDY, p))
        )
        thread.start()
        try:
            assert wait_until(lambda: writing(p))
            assert p.kv()["rank_writes_in_flight"][1] == 1
            os.kill(p.kv()["rank_pids"][0], signal.SIGKILL)
            p.proc.wait(HANG_S)  # rank 0 sees its rank gone and the node exits
        finally:
            os.kill(decode_rank1, signal.SIGCONT)
        assert p.proc.returncode != 0
        assert "tensor-parallel rank 1" in p.log_tail()
        thread.join(HANG_S)
        tokens, _, last = result["out"]
        assert last["finish_reason"] == "length"
        assert_matches_offline(llm, [(prompt, GREEDY)], [tokens])
        dm = d.metrics()
        assert metric_value(dm, "tandem_prefill_fallbacks_total", reason="disconnected") == 1
        assert_clean(d)  # the attempt's blocks came back at the hold timeout
        assert_no_writes_left(d)


def test_an_abort_is_confirmed_only_once_every_ranks_write_has_ended(llama_dir, node_logs, llm):
    """Prefill rank 1's write into a stopped decode rank is in flight when the client
    leaves: the prefill node ends the job at once, but confirms the abort (so the decode
    node frees its blocks) only after that write has ended."""
    with strangers(llama_dir, node_logs, hold_timeout="600") as (p, d):
        decode_rank1 = d.kv()["rank_pids"][0]
        body = {
            "request_id": "tp-gone",
            "token_ids": [random.Random(8).randrange(5, 500) for _ in range(30)],
            "sampling": GREEDY,
            "prefill": p.endpoint,
        }
        os.kill(decode_rank1, signal.SIGSTOP)
        try:
            with httpx.stream("POST", f"{d.url}/generate", json=body, timeout=HANG_S) as r:
                assert r.status_code == 200
                assert wait_until(lambda: writing(p))
            # the client is gone: the job ends on the prefill node, its write does not
            ended = lambda: [j for j in p.kv()["jobs"].values() if j["ended"] == "abort"]  # noqa: E731
            assert wait_until(ended)
            (job,) = ended()
            report = p.kv()
            assert job["writes"] == 1 and writing(p), report
            assert report["rank_writes_in_flight"][1] == 1, report
            assert d.kv()["held"] > 0
        finally:
            os.kill(decode_rank1, signal.SIGCONT)
        assert wait_until(lambda: d.kv()["held"] == 0), "the abort should be confirmed"
        assert_clean(d, p)
        assert_no_writes_left(d, p)
        prompt = [random.Random(9).randrange(5, 500) for _ in range(30)]
        tokens, _, _ = generate(d, "tp-reuse", prompt, GREEDY, p)  # the blocks are usable
        assert_matches_offline(llm, [(prompt, GREEDY)], [tokens])


def _refused(*command: str) -> str:
    result = subprocess.run(
        [sys.executable, "-P", "-m", "tandem.cli", *command],
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
