"""The decode node's API beyond plain generation: stop strings, `/abort`, KV events."""

from __future__ import annotations

import random
import threading
import time

import httpx
import zmq

from tandem.engine import SamplingParams
from tandem.engine.api.kv_events import decode_batch
from tandem.engine.core.block_hash import hash_blocks
from tests.bounds import HANG_S
from tests.disagg.nodes import assert_clean, connect, generate, wait_until
from tests.greedy import assert_well_separated


def test_stop_strings_match_offline_and_are_not_streamed(cluster, llm):
    d, p1 = cluster["d"], cluster["p1"]
    prompt = [random.Random(21).randrange(5, 500) for _ in range(30)]
    base = {"max_tokens": 24, "temperature": 0.0, "ignore_eos": True}
    free = llm.generate(prompt_token_ids=prompt, sampling_params=SamplingParams(**base, logprobs=2),
                        use_tqdm=False)[0].outputs[0]  # fmt: skip
    assert_well_separated(free, "the node's tokens and text are compared exactly")
    full = free.text
    idx = next(i for i in range(3, len(full) - 2) if full[i : i + 2].isalnum())
    stop = full[idx : idx + 2]
    sampling = {**base, "stop": [stop]}
    want = llm.generate(prompt_token_ids=prompt, sampling_params=SamplingParams(**sampling),
                        use_tqdm=False)[0].outputs[0]  # fmt: skip
    tokens, text, last = generate(d, "stop", prompt, sampling, p1)
    assert last["finish_reason"] == "stop" and last["stop_reason"] == stop
    assert text == want.text and stop not in text
    assert tokens == want.token_ids
    assert_clean(d, p1)


def test_abort_endpoint_ends_the_stream(cluster):
    """The request is aborted while it waits for p1, paused: it cannot have finished first,
    however fast the machine (`d` waits for a remote prefill as long as it takes)."""
    d, p1 = cluster["d"], cluster["p1"]
    connect(d, p1)
    records = []
    sampling = {"max_tokens": 400, "temperature": 0.0, "ignore_eos": True}
    thread = threading.Thread(
        target=lambda: records.append(generate(d, "to-abort", [5, 6, 7], sampling, p1))
    )
    p1.pause()
    try:
        thread.start()
        assert wait_until(lambda: d.kv()["in_use"] > 0)
        r = httpx.post(f"{d.url}/abort", json={"request_id": "to-abort"}, timeout=HANG_S)
        assert r.json() == {"aborted": True}
        thread.join(HANG_S)
    finally:
        p1.resume()
    tokens, _, last = records[0]
    assert last["finish_reason"] == "abort" and tokens == []
    r = httpx.post(f"{d.url}/abort", json={"request_id": "to-abort"}, timeout=HANG_S)
    assert r.json() == {"aborted": False}
    assert_clean(d, p1)  # p1 confirms the abort when it wakes up


def test_kv_events_carry_the_stable_hashes_and_sequence_numbers(cluster):
    d, p1 = cluster["d"], cluster["p1"]
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(d.endpoint)
    try:
        assert sub.poll(HANG_S * 1000), "no heartbeat from the decode node"
        batches = [decode_batch(sub.recv())]
        prompt = [random.Random(33).randrange(5, 500) for _ in range(40)]  # 2 full blocks
        generate(d, "events", prompt, {"max_tokens": 2, "temperature": 0.0}, p1)
        deadline = time.monotonic() + HANG_S
        stored: set[int] = set()
        want = set(hash_blocks(prompt, 16))
        while not want <= stored and time.monotonic() < deadline:
            if sub.poll(200):
                batch = decode_batch(sub.recv())
                batches.append(batch)
                stored |= set(batch.stored)
    finally:
        sub.close(0)
        ctx.term()
    assert want <= stored
    seqs = [b.seq for b in batches]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    assert all(b.node == batches[0].node for b in batches)
    last = batches[-1].load
    assert last.total_blocks == 256 and 0 <= last.free_blocks <= 256
