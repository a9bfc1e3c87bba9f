"""A prefill worker killed with a request in hand, as in a fault soak: the decode node fails
over as soon as the connection drops (not at its prefill deadline), and the destination
blocks it holds for the dead attempt come back once the worker restarts (its successor
never heard of the attempt and confirms the abort), not at the hold timeout.

The decode node's deadlines are far beyond the tests' bounds (`cluster["d"]`), so only
those two paths can make them pass."""

from __future__ import annotations

import random
import threading

import pytest

from tests.bounds import HANG_S
from tests.disagg.nodes import Node, assert_clean, generate, metric_value, wait_until

GREEDY = {"max_tokens": 6, "temperature": 0.0, "ignore_eos": True}
REASONS = ("timeout", "unreachable", "error", "disconnected")


@pytest.fixture
def nodes(cluster, spare_prefill):
    """`d` (deadlines beyond anything a test waits for) and a prefill worker to kill."""
    spare_prefill.start().wait_ready()
    return cluster["d"], spare_prefill


def prompt_of(seed: int, length: int = 60) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(5, 500) for _ in range(length)]


def kill_mid_request(d: Node, p: Node, request_id: str, prompt: list[int]) -> tuple:
    """Connect d to p, leave a request in p's socket (p paused), kill p; returns what the
    request streamed, waiting at most a bound that only a hang reaches."""
    _, _, last = generate(d, f"{request_id}-warm", [5, 6], GREEDY, p)
    assert last["finish_reason"] == "length"
    p.pause()
    result: dict = {}
    thread = threading.Thread(
        target=lambda: result.update(out=generate(d, request_id, prompt, GREEDY, p, timeout=HANG_S))
    )
    thread.start()
    assert wait_until(lambda: d.kv()["in_use"] > 0, timeout=HANG_S)
    p.kill()
    thread.join(HANG_S + 10)
    assert "out" in result, "the request waited for its prefill deadline"
    return result["out"]


def fallbacks(node: Node, reason: str) -> float:
    return metric_value(node.metrics(), "tandem_prefill_fallbacks_total", reason=reason)


def test_a_killed_worker_is_failed_over_at_once_and_its_blocks_return_on_restart(nodes):
    d, p = nodes
    before = fallbacks(d, "disconnected")
    tokens, _, last = kill_mid_request(d, p, "cut", prompt_of(1))
    # failed over when the connection dropped: the prefill deadline is far away
    assert last["finish_reason"] == "length" and len(tokens) == GREEDY["max_tokens"]
    assert fallbacks(d, "disconnected") == before + 1
    assert d.kv()["held"] > 0  # nobody can confirm the abort while p is down
    first = p.start().wait_ready()["agent"]  # same ports, a new agent
    # its successor confirms the abort it is sent again: the hold timeout is far away too
    assert wait_until(lambda: d.kv()["held"] == 0, timeout=HANG_S), d.kv()
    assert_clean(d, p)
    before = sum(fallbacks(d, r) for r in REASONS)
    _, _, last = generate(d, "after", prompt_of(2), GREEDY, p)
    assert last["finish_reason"] == "length"
    assert sum(fallbacks(d, r) for r in REASONS) == before, "the successor served it"
    assert p.kv()["agent"] == first
