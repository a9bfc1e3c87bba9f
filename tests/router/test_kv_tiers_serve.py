"""KV tiers through a real `tandem serve` (router, prefill and decode processes): a prompt
pushed out of both nodes' small device pools by others comes back from their host tiers:
`usage` reports its prefix cached, each node counts host hits, the router's index knew the
blocks were in a host tier (its prefix metric by tier), and every block is accounted for
once the copies settled."""

from __future__ import annotations

import httpx
import pytest

from tests.bounds import HANG_S
from tests.disagg.nodes import metric_value, wait_until
from tests.router.conftest import NODE_HEADERS, serving

PROMPT_BLOCKS = 10  # of 16 tokens; the device pools hold 24 blocks
HOST_GIB = 0.002  # a few hundred blocks of the tiny model


@pytest.fixture(scope="module")
def tiered(llama_dir, router_logs):
    flags = ("--prefill", "1", "--decode", "1", "--max-model-len", "512", "--num-kv-blocks",
             "24", "--kv-host-gib", str(HOST_GIB), "--log-level", "warning")  # fmt: skip
    with serving(llama_dir, router_logs, *flags) as proc:
        yield proc


def complete(url: str, prompt: list[int]) -> dict:
    body = {"model": "llama", "prompt": prompt, "max_tokens": 2, "temperature": 0}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=HANG_S)
    assert r.status_code == 200, r.text
    return r.json()


def prompt(seed: int) -> list[int]:
    return [(seed * 31 + i) % 250 + 3 for i in range(PROMPT_BLOCKS * 16 + 1)]


def node_metric(worker: dict, name: str, **labels: str) -> float:
    return metric_value(httpx.get(worker["metrics_url"], timeout=HANG_S).text, name, **labels)


def settled(worker: dict) -> bool:
    kv = httpx.get(f"{worker['url']}/debug/kv", timeout=HANG_S, headers=NODE_HEADERS).json()
    return not kv["tier_copies_in_flight"] and kv["in_use"] == 0 and kv["requests"] == 0


def test_a_prompt_evicted_from_the_device_comes_back_from_the_host_tier(tiered):
    first = complete(tiered.url, prompt(0))
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    for seed in (1, 2, 3):  # 11 blocks each: prompt 0's blocks leave both device pools
        complete(tiered.url, prompt(seed))
    # each worker's metrics address, once the router's health checks have read it
    assert wait_until(lambda: all(w.get("metrics_url") for w in tiered.workers()))
    workers = tiered.workers()
    assert wait_until(lambda: all(settled(w) for w in workers))
    # both workers routable, so the prompt goes to the prefill worker too: one that slow
    # health checks ejected on a loaded machine is not named, and the decode node prefills
    # the prompt itself (a suspected cause of one failure in a full run, not reproduced)
    assert wait_until(lambda: all(w["healthy"] for w in tiered.workers()))
    again = complete(tiered.url, prompt(0))
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == PROMPT_BLOCKS * 16
    for worker in workers:  # counted at admission, exported by the loop's next turn
        hit = lambda w=worker: node_metric(w, "tandem_kv_tier_hits_total", tier="host") > 0  # noqa: E731
        assert wait_until(hit), (worker["role"], tiered.workers())
        assert node_metric(worker, "tandem_kv_tier_capacity_blocks", tier="host") > 0
    router = httpx.get(f"{tiered.url}/metrics", timeout=HANG_S).text
    assert metric_value(router, "tandem_router_prefix_overlap_blocks_total", tier="host") > 0
    assert wait_until(lambda: all(settled(w) for w in workers))
