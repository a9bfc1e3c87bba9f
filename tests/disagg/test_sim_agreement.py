"""The simulator against the real system on what is deterministic: a real decode node and
prefill worker serve a workload one request at a time, and `tandem.sim` replays the same
prompts; which requests hit the decode node's prefix cache, how many blocks they reuse
(after evictions from a small cache), which were prefilled remotely, and how many steps
the decode node ran and tokens it computed must agree. Times are not compared here
(docs/performance.md has the timing validation)."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from tandem.sim.cluster import Cluster, ClusterConfig
from tandem.sim.profiles import load_profile
from tandem.sim.shapes import load_shape
from tandem.sim.workload import SimRequest
from tests.bounds import HANG_S
from tests.disagg.nodes import Node, assert_clean, generate, metric_value, running

BLOCK = 16
THRESHOLD = 40  # uncached prompt tokens from which the decode node asks the prefill worker
NUM_BLOCKS = 48  # small enough that the workload evicts cached prefixes
MAX_TOKENS = 3


def prompts(vocab: int) -> list[list[int]]:
    """Six shared prefixes of 40-150 tokens (41 blocks together), each request adding 3-60
    tokens of its own; every fifth request has no shared prefix."""
    rng = np.random.default_rng(23)
    prefixes = [rng.integers(0, vocab, n).tolist() for n in (40, 72, 150, 100, 130, 90)]
    out = []
    for i in range(24):
        prefix = prefixes[int(rng.integers(0, len(prefixes)))] if i % 5 else []
        out.append(prefix + rng.integers(0, vocab, int(rng.integers(3, 61))).tolist())
    return out


@pytest.fixture(scope="module")
def decode(llama_dir, node_logs):
    node = Node(
        "decode", llama_dir, node_logs,
        "--max-num-batched-tokens", "256", "--max-model-len", "512",
        "--num-kv-blocks", str(NUM_BLOCKS), "--remote-prefill-threshold", str(THRESHOLD),
        "--prefill-timeout", "600", "--hold-timeout", "600",
    )  # fmt: skip
    with running({"d": node}):
        yield node


def serve_one(decode: Node, prefill: Node, rid: str, tokens: list[int]) -> tuple[int, bool]:
    """(prompt tokens the decode node found cached, prefilled remotely) of one request
    served to its end. The decode node's own hit, from its counter: `usage` reports the
    larger of its hit and the prefill worker's, whose pool is not the simulated one."""

    def count(name: str, **labels: str) -> float:
        return metric_value(decode.metrics(), name, **labels)

    remote = count("tandem_disagg_decisions_total", decision="remote")
    fallbacks = count("tandem_prefill_fallbacks_total")
    hits = count("tandem_prefix_cache_hits_total")
    sampling = {"max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True}
    _, _, last = generate(decode, rid, tokens, sampling, prefill)
    assert last["finish_reason"] == "length", last
    assert count("tandem_prefill_fallbacks_total") == fallbacks, "a remote prefill failed over"
    assert last["usage"]["cached_tokens"] >= count("tandem_prefix_cache_hits_total") - hits
    return int(count("tandem_prefix_cache_hits_total") - hits), count(
        "tandem_disagg_decisions_total", decision="remote"
    ) > remote


def logged_steps(node: Node, since: int = 0) -> list[dict]:
    return httpx.get(f"{node.url}/debug/steps", params={"since": since}, timeout=HANG_S).json()[
        "steps"
    ]


def simulate(llama_dir, sent: list[list[int]], num_blocks: int) -> tuple[list, tuple[int, int]]:
    """Per request (cached prompt tokens, prefilled remotely); the decode node's (steps,
    tokens computed)."""
    config = ClusterConfig(
        num_prefill=1,
        num_decode=1,
        remote_prefill_threshold=THRESHOLD,
        block_size=BLOCK,
        num_kv_blocks=num_blocks,
        max_num_batched_tokens=256,
        max_model_len=512,
    )
    cluster = Cluster(config, load_shape(str(llama_dir)), load_profile("h100"))
    # one at a time, as served: each arrives long after the one before has finished
    requests = [
        SimRequest.of_tokens(f"r{i}", 100.0 * i, tokens, MAX_TOKENS)
        for i, tokens in enumerate(sent)
    ]
    records = cluster.run(requests)
    cluster.check_integrity()
    (node,) = cluster.decodes
    return [(r.num_cached_tokens, bool(r.remote)) for r in records], (
        node.num_steps,
        node.num_tokens,
    )


def test_simulated_and_real_requests_hit_the_same_blocks(cluster, decode, llama_dir):
    prefill = cluster["p1"]
    vocab = load_shape(str(llama_dir)).vocab_size
    rng = np.random.default_rng(7)
    sent: list[list[int]] = []
    # Warm up until the decode node's connection to the worker is up (a first request may
    # find it down and prefill here: counted as a fallback). Replayed in the simulation too.
    while True:
        warm = rng.integers(0, vocab, THRESHOLD + 8).tolist()
        fallbacks = metric_value(decode.metrics(), "tandem_prefill_fallbacks_total")
        generate(decode, f"w{len(sent)}", warm, {"max_tokens": 1, "ignore_eos": True}, prefill)
        sent.append(warm)
        if metric_value(decode.metrics(), "tandem_prefill_fallbacks_total") == fallbacks:
            break
    warm_steps = logged_steps(decode)
    last_warm = warm_steps[-1]["seq"] if warm_steps else 0  # a remote 1-token request: none
    real = [serve_one(decode, prefill, f"q{i}", p) for i, p in enumerate(prompts(vocab))]
    assert_clean(decode)
    steps = logged_steps(decode, last_warm)

    simulated, (num_steps, num_tokens) = simulate(llama_dir, [*sent, *prompts(vocab)], NUM_BLOCKS)
    assert simulated[len(sent) :] == real
    _, (warm_num_steps, warm_num_tokens) = simulate(llama_dir, sent, NUM_BLOCKS)
    # steps[0] is the first after the warm-up; the log kept every step since
    assert steps[0]["seq"] == last_warm + 1
    assert (len(steps), sum(s["num_tokens"] for s in steps)) == (
        num_steps - warm_num_steps,
        num_tokens - warm_num_tokens,
    )
    assert all(s["num_seqs"] == 1 for s in steps)  # served one at a time
    # the loop measures a cycle between a request's steps and none after its last one,
    # when it goes idle until the next request
    assert sum(s["cycle_s"] is None for s in steps) == len(real)
    blocks = [cached // BLOCK for cached, _ in real]
    # the workload exercises what it should: hits and misses, remote and local prefills,
    # and evictions (a larger cache would have kept more)
    assert any(blocks) and not all(blocks)
    assert {remote for _, remote in real} == {True, False}
    roomy = simulate(llama_dir, [*sent, *prompts(vocab)], 1000)[0][len(sent) :]
    assert sum(c for c, _ in roomy) > sum(c for c, _ in real)
