"""Fencing with real processes: a prefill worker stopped (SIGSTOP) in the middle of writing a
request's KV, past the decode node's hold timeout, then resumed. The decode node must not
hand the blocks that worker may still write into to another request: they are quarantined
until it confirms, and another request's cached KV is the same, byte for byte, after the
worker's late writes have landed. Then every block is accounted for again.

The worker is stopped once its first blocks have landed: its prompt takes many steps of
one block each, and a write follows every step, so the stop lands mid-job (nearly always
inside a step), and when it resumes it finishes that step and posts its write before it
reads the abort.
Its deadline (the decode node's `--prefill-timeout`) is far off, so it never refuses the
job; the attempt is abandoned by the client's abort instead."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tandem.engine.core.block_hash import hash_blocks
from tandem.node.debug_routes import MAX_BLOCK_HASHES
from tests.bounds import HANG_S
from tests.disagg.nodes import (
    Node,
    assert_clean,
    connect,
    generate,
    metric_value,
    running,
    wait_until,
)

BLOCK = 16
A_BLOCKS = 60  # the abandoned attempt's destination blocks (its prompt plus one token)
NUM_BLOCKS = 120
B1_BLOCKS = NUM_BLOCKS - A_BLOCKS  # takes every block the attempt does not hold
GREEDY = {"max_tokens": 1, "temperature": 0.0, "ignore_eos": True}
COMMON = ("--max-model-len", "1024", "--threads", "1")


@pytest.fixture(scope="module")
def fenced(llama_dir, node_logs) -> Iterator[tuple[Node, Node]]:
    """A decode node that holds an abandoned attempt's blocks for 1 s only, and a prefill
    worker that computes and writes one block per step."""
    d = Node(
        "decode", llama_dir, node_logs, *COMMON, "--num-kv-blocks", str(NUM_BLOCKS),
        "--prefill-timeout", "600", "--hold-timeout", "1",
    )  # fmt: skip
    p = Node(
        "prefill", llama_dir, node_logs, *COMMON, "--num-kv-blocks", "128",
        "--max-num-batched-tokens", str(BLOCK),
    )  # fmt: skip
    with running({"d": d, "p": p}):
        connect(d, p)
        yield d, p


def prompt_of(seed: int | str, num_blocks: int) -> list[int]:
    """A prompt that, with the first generated token, fills exactly `num_blocks` blocks."""
    rng = random.Random(seed)
    return [rng.randrange(5, 500) for _ in range(num_blocks * BLOCK - 1)]


def log_has(path: Path, *parts: str) -> bool:
    text = path.read_text(errors="replace")
    return any(all(p in line for p in parts) for line in text.splitlines())


def blocks_written(p: Node) -> float:
    return metric_value(p.metrics(), "tandem_kv_transfer_blocks_total")


def cached_bytes(d: Node, prompt: list[int]) -> dict[str, str]:
    """The decode node's cached KV of the prompt's full blocks, by hash."""
    hashes = hash_blocks(prompt, BLOCK)
    found: dict[str, str] = {}
    for i in range(0, len(hashes), MAX_BLOCK_HASHES):
        chunk = hashes[i : i + MAX_BLOCK_HASHES]
        found |= httpx.post(f"{d.url}/debug/blocks", json={"hashes": chunk}, timeout=HANG_S).json()
    assert len(found) == len(hashes), "the request's blocks are not all cached"
    return found


def abandon_mid_write(d: Node, p: Node, request_id: str) -> bool:
    """Send a request through `p`, stop `p` once some of its blocks have landed, and abort
    the request at `d`. True if the attempt was abandoned while `p` was writing (False: `p`
    finished first, and is resumed)."""
    result: dict = {}
    prompt = prompt_of(request_id, A_BLOCKS)
    before = blocks_written(p)
    thread = threading.Thread(
        target=lambda: result.update(out=generate(d, request_id, prompt, GREEDY, p))
    )
    thread.start()
    writing = wait_until(lambda: blocks_written(p) >= before + 4, interval=0.001)
    p.pause()
    assert writing, "the prefill worker never wrote a block"
    httpx.post(f"{d.url}/abort", json={"request_id": request_id}, timeout=HANG_S)
    thread.join(HANG_S)
    if f"{request_id}@1" in d.kv()["holds"]:
        return True
    p.resume()
    return False


def test_a_stopped_writer_never_writes_into_another_requests_blocks(fenced):
    d, p = fenced
    attempts = (f"fenced-{i}" for i in range(3))
    request_id = next(rid for rid in attempts if abandon_mid_write(d, p, rid))
    key = f"{request_id}@1"
    try:
        # The hold times out with the worker stopped: nobody confirmed it.
        assert wait_until(lambda: log_has(d.log_path, f"hold {key}: no confirmation"))
        # Another request takes every block the attempt does not hold, and ends; then one
        # more takes as many blocks as the attempt held: its KV is what a late write of
        # the stopped worker would overwrite, had the held blocks been freed.
        b1 = prompt_of(1, B1_BLOCKS)
        assert generate(d, "fenced-b1", b1, GREEDY)[2]["finish_reason"] == "length"
        b2 = prompt_of(2, A_BLOCKS)
        assert generate(d, "fenced-b2", b2, GREEDY)[2]["finish_reason"] == "length"
        before = cached_bytes(d, b2)
        while_stopped = d.kv()
    finally:
        p.resume()
    # The worker finishes its step, posts its write, reads the abort and confirms once
    # every write has landed; only then is the hold released.
    assert wait_until(lambda: d.kv()["held"] == 0 and not p.kv()["jobs"])
    assert cached_bytes(d, b2) == before
    # While the writer could still write, its blocks were quarantined, not free.
    assert while_stopped.get("quarantined") == A_BLOCKS, while_stopped
    assert while_stopped["quarantined_holds"] == [key]
    assert while_stopped["in_use"] == while_stopped["held"] == A_BLOCKS
    assert while_stopped["free"] + while_stopped["cached"] == NUM_BLOCKS - A_BLOCKS
    m = d.metrics()
    assert metric_value(m, "tandem_kv_quarantines_total") == 1
    assert metric_value(m, "tandem_kv_quarantine_releases_total", reason="confirmed") == 1
    assert metric_value(m, "tandem_kv_quarantined_blocks") == 0
    assert log_has(d.log_path, f"hold {key}: the prefill worker confirmed late")
    assert d.kv()["quarantined"] == 0
    assert_clean(d, p)
