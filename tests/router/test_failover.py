"""Decode workers that die: before the first token the router retries elsewhere; after it
the stream ends with an error event; health checks eject dead workers and bring restarted
ones back. Real processes: one prefill node, two decode nodes, routers over them."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.bounds import HANG_S
from tests.disagg.nodes import Node, assert_clean, metric_value, running, wait_until
from tests.router.conftest import RouterProc

FLAGS = ("--max-model-len", "512", "--num-kv-blocks", "128", "--max-num-batched-tokens", "256")


@pytest.fixture(scope="module")
def workers(llama_dir, router_logs):
    nodes = {
        "p": Node("prefill", llama_dir, router_logs, *FLAGS),
        "d1": Node("decode", llama_dir, router_logs, *FLAGS),
        "d2": Node("decode", llama_dir, router_logs, *FLAGS),
    }
    with running(nodes):
        yield nodes


@pytest.fixture
def router_over(workers, llama_dir, router_logs):
    started = []

    def start(*flags: str) -> RouterProc:
        decode = [workers["d1"].url, workers["d2"].url]
        proc = RouterProc(llama_dir, router_logs, [workers["p"].url], decode, *flags)
        started.append(proc)
        proc.start().wait_ready()
        assert wait_until(lambda: all(w["healthy"] for w in _workers(proc)))
        return proc

    yield start
    for proc in started:
        proc.stop()
    for node in workers.values():  # whatever a test killed comes back for the next
        if node.proc.poll() is not None:
            node.start().wait_ready()


def _workers(router: RouterProc) -> list[dict]:
    return httpx.get(f"{router.url}/workers", timeout=HANG_S).json()


def _health(router: RouterProc, node: Node) -> bool:
    return next(w["healthy"] for w in _workers(router) if w["url"] == node.url)


def test_a_dead_decode_worker_before_the_first_token_is_retried_elsewhere(workers, router_over):
    # a long health interval: the router learns of the death from the failed request
    router = router_over("--policy", "round-robin", "--health-interval", "60")
    workers["d2"].kill()
    client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="x", max_retries=0)
    for _ in range(4):  # round-robin sends one of the first two to the dead worker
        r = client.completions.create(
            model="llama", prompt="Hello", max_tokens=4, extra_body={"ignore_eos": True}
        )
        assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 4
    metrics = router.metrics()
    assert metric_value(metrics, "tandem_router_retries_total", reason="decode_failed") == 1
    assert not _health(router, workers["d2"])
    assert_clean(workers["d1"], workers["p"])


def test_a_decode_worker_killed_mid_stream_ends_the_stream_with_an_error(workers, router_over):
    router = router_over("--health-interval", "60")
    client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="x", max_retries=0)
    stream = client.completions.create(
        model="llama", prompt="Go on", max_tokens=450, extra_body={"ignore_eos": True}, stream=True
    )
    chunks = iter(stream)
    assert next(chunks).choices[0].text is not None
    # Both paused at once, so the request cannot end before its worker is killed, however
    # fast the machine; the router tells which one has it.
    decoders = (workers["d1"], workers["d2"])
    for node in decoders:
        node.pause()
    try:
        inflight = {w["url"]: w["load"]["inflight"] for w in _workers(router)}
        busy = [n for n in decoders if inflight[n.url] == 1]
        assert len(busy) == 1, inflight
        busy[0].kill()
    finally:
        for node in decoders:
            node.resume()
    with pytest.raises(openai.APIError) as err:
        for _ in chunks:
            pass
    assert "mid-stream" in str(err.value)
    survivor = workers["d2"] if busy[0] is workers["d1"] else workers["d1"]
    assert_clean(survivor, workers["p"])
    # the next request goes to the survivor
    r = client.completions.create(
        model="llama", prompt="Again", max_tokens=3, extra_body={"ignore_eos": True}
    )
    assert r.usage.completion_tokens == 3


def test_health_checks_eject_a_dead_worker_and_bring_it_back(workers, router_over):
    router = router_over("--health-interval", "0.3")
    d2 = workers["d2"]
    agent = next(w["agent"] for w in _workers(router) if w["url"] == d2.url)
    d2.kill()
    assert wait_until(lambda: not _health(router, d2))
    client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="x", max_retries=0)
    for _ in range(3):
        assert client.completions.create(model="llama", prompt="Hi", max_tokens=2).choices
    assert metric_value(router.metrics(), "tandem_router_retries_total") == 0
    d2.start().wait_ready()
    assert wait_until(lambda: _health(router, d2))
    assert next(w["agent"] for w in _workers(router) if w["url"] == d2.url) != agent
