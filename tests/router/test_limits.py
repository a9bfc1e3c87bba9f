"""Errors that depend on the router's state: API keys (401), saturation (429), no worker
(503), and a client that goes away (the request is aborted downstream, nothing leaks).

A request that must still be running when the test acts is one the decode node cannot
finish meanwhile: the test pauses that node (SIGSTOP) from the moment the request is seen
running until the router has done its part, so the outcome does not depend on how fast the
machine generates."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from pathlib import Path

import httpx
import openai
import pytest

from tandem.router.preprocess import MAX_PROMPTS
from tests.bounds import HANG_S
from tests.disagg.nodes import free_port, metric_value, wait_until
from tests.router.conftest import NODE_HEADERS, SERVE_FLAGS, RouterProc

PROMPT = "Tell me everything"
MAX_MODEL_LEN = int(SERVE_FLAGS[SERVE_FLAGS.index("--max-model-len") + 1])


@pytest.fixture(scope="module")
def long(serve) -> dict:
    """A request as long as the server allows: it is far from done when the test acts."""
    r = httpx.post(f"{serve.url}/tokenize", json={"prompt": PROMPT}, timeout=HANG_S)
    return {"prompt": PROMPT, "max_tokens": MAX_MODEL_LEN - r.json()["count"], "ignore_eos": True}


class Child:
    """The child process of `tandem serve` that serves `url`: to pause and resume."""

    def __init__(self, serve, url: str) -> None:
        port = url.rsplit(":", 1)[1]
        pgrep = ["pgrep", "-P", str(serve.proc.pid)]
        for pid in subprocess.run(pgrep, capture_output=True, text=True).stdout.split():
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            if "--http-port" in argv and argv[argv.index("--http-port") + 1] == port:
                self.pid = int(pid)
                return
        raise LookupError(f"no child of tandem serve serves {url}")

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)


def in_flight(metrics: str) -> float:
    """Generations the router is still handling, from its /metrics."""
    return metric_value(metrics, "tandem_router_requests_in_flight")


def all_healthy(serve) -> bool:
    """After a pause: the router may have ejected the paused worker for a while."""
    return all(w["healthy"] for w in serve.workers())


@pytest.fixture(scope="module")
def guarded(serve, llama_dir, router_logs):
    """A second router over the same workers, with an API key and one request at a time."""
    prefill = [w["url"] for w in serve.workers("prefill")]
    decode = [w["url"] for w in serve.workers("decode")]
    proc = RouterProc(
        llama_dir, router_logs, prefill, decode, "--api-key", "sesame", "--max-inflight", "1"
    )
    try:
        proc.start().wait_ready()
        assert wait_until(
            lambda: httpx.get(f"{proc.url}/health", timeout=HANG_S).status_code == 200
        )
        yield proc
    finally:
        proc.stop()


def test_api_keys_are_checked(guarded):
    bad = openai.OpenAI(base_url=f"{guarded.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model="llama", prompt="x", max_tokens=2)
    r = httpx.post(f"{guarded.url}/v1/completions", json={"prompt": "x"}, timeout=HANG_S)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    good = openai.OpenAI(base_url=f"{guarded.url}/v1", api_key="sesame", max_retries=0)
    assert good.completions.create(model="llama", prompt="x", max_tokens=2).choices
    assert httpx.get(f"{guarded.url}/health", timeout=HANG_S).status_code == 200  # no key


def test_saturation_is_429_with_retry_after(guarded, serve, long):
    headers = {"Authorization": "Bearer sesame"}
    url = f"{guarded.url}/v1/completions"
    (decode,) = serve.workers("decode")
    node = Child(serve, decode["url"])
    body = {**long, "stream": True}
    with httpx.stream("POST", url, json=body, headers=headers, timeout=HANG_S) as first:
        lines = first.iter_lines()  # kept: a dropped iterator closes the stream
        line = next(lines)  # the first request is in flight
        assert line.startswith("data: {") and first.status_code == 200, line
        node.pause()  # and stays in flight
        try:
            r = httpx.post(url, json={"prompt": "x"}, headers=headers, timeout=HANG_S)
        finally:
            node.resume()
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["type"] == "rate_limit_error"
    # the closed stream frees the slot
    assert wait_until(
        lambda: (
            httpx.post(
                url, json={"prompt": "x", "max_tokens": 2}, headers=headers, timeout=HANG_S
            ).status_code
            == 200
        )
    )


def test_more_choices_than_max_inflight_or_prompts_than_allowed_is_a_400(guarded, serve):
    headers = {"Authorization": "Bearer sesame"}
    url = f"{guarded.url}/v1/completions"
    r = httpx.post(url, json={"prompt": "x", "n": 2}, headers=headers, timeout=HANG_S)
    assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text
    r = httpx.post(url, json={"prompt": ["x", "y"]}, headers=headers, timeout=HANG_S)
    assert r.status_code == 400, r.text  # two prompts are two choices
    body = {"prompt": ["x"] * (MAX_PROMPTS + 1), "max_tokens": 1}
    r = httpx.post(f"{serve.url}/v1/completions", json=body, timeout=HANG_S)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text


def test_no_worker_is_503_with_retry_after(llama_dir, router_logs):
    dead = f"http://127.0.0.1:{free_port()}"
    proc = RouterProc(llama_dir, router_logs, [], [dead])
    try:
        proc.start().wait_ready()
        client = openai.OpenAI(base_url=f"{proc.url}/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.InternalServerError) as err:
            client.completions.create(model="llama", prompt="x", max_tokens=2)
        assert err.value.status_code == 503
        assert int(err.value.response.headers["retry-after"]) >= 1
        assert httpx.get(f"{proc.url}/health", timeout=HANG_S).status_code == 503
        assert httpx.get(f"{proc.url}/workers", timeout=HANG_S).json()[0]["healthy"] is False
    finally:
        proc.stop()


def test_the_router_stays_ready_through_a_decode_outage(serve, llama_dir, router_logs):
    """Readiness gates the start only: once a decode worker was healthy, /health stays 200
    while none is (its status says so), so the router keeps its place in its Service and
    clients are answered (503 with Retry-After) rather than refused a connection."""
    (decode,) = serve.workers("decode")
    proc = RouterProc(llama_dir, router_logs, [], [decode["url"]], "--health-timeout", "1")
    node = Child(serve, decode["url"])
    health = lambda: httpx.get(f"{proc.url}/health", timeout=HANG_S)  # noqa: E731
    try:
        proc.start().wait_ready()
        assert wait_until(lambda: health().json()["status"] == "ok")
        node.pause()  # its health checks time out: the router ejects it
        try:
            assert wait_until(lambda: health().json()["status"] == "no decode worker")
            assert health().status_code == 200
        finally:
            node.resume()
        assert wait_until(lambda: health().json()["status"] == "ok")
    finally:
        proc.stop()
    assert wait_until(lambda: all_healthy(serve))


def _decode_state(serve) -> tuple[str, float]:
    (decode,) = serve.workers("decode")
    metrics = httpx.get(decode["metrics_url"], timeout=HANG_S).text
    aborted = metric_value(metrics, "tandem_request_success_total", finish_reason="abort")
    return decode["url"], aborted


def _clean(url: str) -> bool:
    kv = httpx.get(f"{url}/debug/kv", timeout=HANG_S, headers=NODE_HEADERS).json()
    return kv["requests"] == 0 and kv["in_use"] == 0 and kv["held"] == 0


def _assert_aborted_and_clean(serve, url: str, aborted: float) -> None:
    assert wait_until(lambda: _decode_state(serve)[1] == aborted)
    (prefill,) = serve.workers("prefill")
    assert wait_until(lambda: _clean(url) and _clean(prefill["url"]))
    assert wait_until(lambda: all_healthy(serve))


def test_a_closed_stream_aborts_the_request_downstream(serve, long):
    url, aborted = _decode_state(serve)
    node = Child(serve, url)
    body = {**long, "stream": True}
    try:
        with httpx.stream("POST", f"{serve.url}/v1/completions", json=body, timeout=HANG_S) as r:
            lines = r.iter_lines()
            chunk = json.loads(next(line for line in lines if line)[len("data: ") :])
            assert chunk["choices"][0]["finish_reason"] is None
            node.pause()  # the request cannot finish before the router lets it go
        metrics = f"{serve.url}/metrics"
        assert wait_until(lambda: in_flight(httpx.get(metrics, timeout=HANG_S).text) == 0)
    finally:
        node.resume()
    _assert_aborted_and_clean(serve, url, aborted + 1)


def test_a_client_that_gives_up_aborts_a_non_streamed_request(serve, long):
    """The client leaves once both copies run on the decode node: no client timeout, so
    the test does not depend on how long the request would take."""
    url, aborted = _decode_state(serve)
    node = Child(serve, url)
    body = {**long, "n": 2}

    async def give_up() -> None:
        async with httpx.AsyncClient(timeout=HANG_S, headers=NODE_HEADERS) as probe:
            client = httpx.AsyncClient(timeout=HANG_S)
            post = asyncio.ensure_future(client.post(f"{serve.url}/v1/completions", json=body))
            while (await probe.get(f"{url}/debug/kv")).json()["requests"] < 2:
                if post.done():
                    pytest.fail(f"the request ended first: {post.result().text[:300]}")
                await asyncio.sleep(0.05)  # the polling interval
            node.pause()  # neither copy can finish before the router lets them go
            post.cancel()
            await client.aclose()  # the connection closes: the client is gone
            while in_flight((await probe.get(f"{serve.url}/metrics")).text):
                await asyncio.sleep(0.05)

    try:
        asyncio.run(asyncio.wait_for(give_up(), HANG_S))
    finally:
        node.resume()
    _assert_aborted_and_clean(serve, url, aborted + 2)


def test_a_stopped_decode_worker_is_ejected_and_its_stream_ends_with_the_error(serve, long):
    """The node stops mid-stream (SIGSTOP: nothing of it answers). The router's health
    checks eject it, which ends the stream with the mid-stream error event, however long
    the node stays stopped; once resumed, the node aborts the request and is healthy."""
    url, aborted = _decode_state(serve)
    node = Child(serve, url)
    body = {**long, "stream": True}
    try:
        with httpx.stream("POST", f"{serve.url}/v1/completions", json=body, timeout=HANG_S) as r:
            lines = (line for line in r.iter_lines() if line)
            chunk = json.loads(next(lines)[len("data: ") :])
            assert chunk["choices"][0]["finish_reason"] is None
            node.pause()  # stays stopped until the stream has ended
            rest = list(lines)
    finally:
        node.resume()
    assert rest[-1] == "data: [DONE]", rest[-3:]
    error = json.loads(rest[-2][len("data: ") :])["error"]
    assert error["message"].startswith("decode worker failed mid-stream"), error
    assert "ejected" in error["message"], error
    _assert_aborted_and_clean(serve, url, aborted + 1)
    (decode,) = serve.workers("decode")
    live_url = decode["metrics_url"].removesuffix("/metrics") + "/health/live"  # metrics port
    live = httpx.get(live_url, timeout=HANG_S)
    assert live.status_code == 200 and live.json()["status"] == "ok"
