"""Failures with real processes: a prefill worker that never answers, one killed
mid-request, one restarted, a client abort during a transfer, and a decode node out of
blocks. After each, every block on every node is accounted for.

Deadlines are waited for only on `d_deadline` and `d_fail` (see conftest): elsewhere a
remote prefill cannot time out, however slow the machine."""

from __future__ import annotations

import random
import threading

import httpx

from tests.bounds import HANG_S
from tests.disagg.nodes import assert_clean, connect, generate, metric_value, wait_until
from tests.disagg.test_disagg import assert_matches_offline, run_concurrently, workload


def prompt_of(seed: int, length: int = 40) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(5, 500) for _ in range(length)]


GREEDY = {"max_tokens": 6, "temperature": 0.0, "ignore_eos": True}


def assert_offline_tokens(llm, prompt: list[int], tokens: list[int]) -> None:
    assert_matches_offline(llm, [(prompt, GREEDY)], [tokens])


def fallbacks(node, reason: str) -> float:
    return metric_value(node.metrics(), "tandem_prefill_fallbacks_total", reason=reason)


def test_silent_prefill_worker_fails_over_to_another_once(cluster, llm):
    d, p1, p2 = cluster["d_deadline"], cluster["p1"], cluster["p2"]
    connect(d, p1)
    connect(d, p2)  # the retry is then a small warm prefill, far within the deadline
    before = fallbacks(d, "timeout")
    prompt = prompt_of(1)
    p1.pause()
    try:
        tokens, _, last = generate(d, "silent", prompt, GREEDY, p1, alternates=(p2,))
    finally:
        p1.resume()
    assert last["finish_reason"] == "length"
    assert_offline_tokens(llm, prompt, tokens)
    assert fallbacks(d, "timeout") == before + 1
    # p1 wakes up to the request and its abort, acks, and the held blocks come back.
    assert_clean(d, p1, p2)


def test_no_prefill_worker_left_means_recompute_locally(cluster, llm):
    d, p1 = cluster["d_deadline"], cluster["p1"]
    connect(d, p1)
    before = fallbacks(d, "timeout")
    prompt = prompt_of(2)
    p1.pause()
    try:
        tokens, _, last = generate(d, "alone", prompt, GREEDY, p1)
    finally:
        p1.resume()
    assert last["finish_reason"] == "length"
    assert_offline_tokens(llm, prompt, tokens)
    assert fallbacks(d, "timeout") == before + 1
    assert_clean(d, p1)


def test_paused_worker_before_any_connection_is_unreachable(cluster, spare_prefill, llm):
    d = cluster["d"]
    spare_prefill.start().wait_ready()
    spare_prefill.pause()
    before = fallbacks(d, "unreachable")
    prompt = prompt_of(9)
    tokens, _, _ = generate(d, "never-met", prompt, GREEDY, spare_prefill)
    assert_offline_tokens(llm, prompt, tokens)
    assert fallbacks(d, "unreachable") == before + 1


def test_fail_policy_ends_the_request_with_an_error(cluster):
    d, p1 = cluster["d_fail"], cluster["p1"]
    connect(d, p1)
    before = fallbacks(d, "timeout")
    p1.pause()
    try:
        tokens, _, last = generate(d, "doomed", prompt_of(3), GREEDY, p1)
    finally:
        p1.resume()
    assert tokens == [] and last["finish_reason"] == "error"
    assert "remote prefill failed" in last["error"]
    assert last["error_source"] == "prefill"  # the router keeps this node in its pool
    assert fallbacks(d, "timeout") == before + 1
    assert_clean(d, p1)


def test_prefill_killed_mid_request(cluster, spare_prefill, llm):
    d = cluster["d_deadline"]
    spare_prefill.start().wait_ready()
    connect(d, spare_prefill)
    prompt = prompt_of(4, 100)
    spare_prefill.pause()  # it has the request in its socket, and never gets to it
    result = {}
    thread = threading.Thread(
        target=lambda: result.update(out=generate(d, "killed", prompt, GREEDY, spare_prefill))
    )
    thread.start()
    assert wait_until(lambda: d.kv()["in_use"] > 0)
    spare_prefill.kill()
    # The attempt is abandoned (the request goes on here) and nobody is left to confirm the
    # abort: its blocks stay held, watched while they are, until the hold timeout.
    assert wait_until(lambda: d.kv()["held"] > 0)
    thread.join(HANG_S)
    tokens, _, last = result["out"]
    assert last["finish_reason"] == "length"
    assert_offline_tokens(llm, prompt, tokens)
    assert_clean(d)
    # A dead worker is now refused at once, without waiting for a deadline.
    before = fallbacks(d, "unreachable")
    tokens, _, _ = generate(d, "after-kill", prompt, GREEDY, spare_prefill)
    assert_offline_tokens(llm, prompt, tokens)
    assert fallbacks(d, "unreachable") == before + 1
    assert_clean(d)


def test_restarted_prefill_worker_is_a_new_agent(cluster, spare_prefill, llm):
    d = cluster["d"]
    first = spare_prefill.start().wait_ready()["agent"]
    prompt = prompt_of(5)
    assert_offline_tokens(llm, prompt, generate(d, "r1", prompt, GREEDY, spare_prefill)[0])
    spare_prefill.kill()
    second = spare_prefill.start().wait_ready()["agent"]  # same ports, new process
    assert second != first and second.rsplit("-", 1)[0] == first.rsplit("-", 1)[0]
    # The decode node reconnects on its own, in its time: wait until it has.
    connect(d, spare_prefill)
    before = metric_value(d.metrics(), "tandem_prefill_fallbacks_total")
    prompt = prompt_of(6)
    assert_offline_tokens(llm, prompt, generate(d, "r2", prompt, GREEDY, spare_prefill)[0])
    after = metric_value(d.metrics(), "tandem_prefill_fallbacks_total")
    assert after == before, "the restarted worker served the request itself"
    assert_clean(d, spare_prefill)


def test_client_abort_during_transfer_frees_blocks_on_both_sides(cluster, llm):
    d, p1 = cluster["d"], cluster["p1"]
    connect(d, p1)
    p1.pause()
    body = {
        "request_id": "gone",
        "token_ids": prompt_of(8, 90),
        "sampling": GREEDY,
        "prefill": p1.endpoint,
    }
    try:
        with httpx.stream("POST", f"{d.url}/generate", json=body, timeout=HANG_S) as r:
            assert r.status_code == 200
            assert wait_until(lambda: d.kv()["in_use"] > 0)
        # The client is gone: the decode node aborts and holds the destination blocks.
        assert wait_until(lambda: d.kv()["held"] > 0)
    finally:
        p1.resume()
    # d's hold timeout is beyond this wait: only p1's confirmation can free the blocks.
    assert wait_until(lambda: d.kv()["held"] == 0), "p1 should confirm the abort"
    assert_clean(d, p1)
    # The freed blocks are reused correctly.
    items = workload(11, 6)
    results = run_concurrently(d, items, p1, "reuse-")
    assert_matches_offline(llm, items, [r[0] for r in results])
    assert_clean(d, p1)


def test_decode_out_of_blocks_makes_requests_wait(cluster, llm):
    """12 blocks of 16 tokens: each request needs 5-6, so at most two run at a time."""
    d, p1 = cluster["d_small"], cluster["p1"]
    connect(d, p1)

    def counts() -> tuple[float, float]:
        text = d.metrics()
        return (
            metric_value(text, "tandem_disagg_decisions_total", decision="remote"),
            metric_value(text, "tandem_prefill_fallbacks_total"),
        )

    before = counts()
    rng = random.Random(12)
    items = [
        ([rng.randrange(5, 500) for _ in range(70)], {**GREEDY, "max_tokens": 8}) for _ in range(6)
    ]
    results = run_concurrently(d, items, p1, "tight-")
    assert_matches_offline(llm, items, [r[0] for r in results])
    remote, fallen_back = (a - b for a, b in zip(counts(), before))
    assert remote == 6 and fallen_back == 0
    assert_clean(d, p1)
