"""Errors that depend on the router's state: API keys (401), saturation (429), no worker
(503), and a client that goes away (the request is aborted downstream, nothing leaks)."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from tests.disagg.nodes import free_port, metric_value, wait_until
from tests.router.conftest import RouterProc

LONG = {"prompt": "Tell me everything", "max_tokens": 400, "ignore_eos": True}


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
        assert wait_until(lambda: httpx.get(f"{proc.url}/health").status_code == 200)
        yield proc
    finally:
        proc.stop()


def test_api_keys_are_checked(guarded):
    bad = openai.OpenAI(base_url=f"{guarded.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model="llama", prompt="x", max_tokens=2)
    r = httpx.post(f"{guarded.url}/v1/completions", json={"prompt": "x"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    good = openai.OpenAI(base_url=f"{guarded.url}/v1", api_key="sesame", max_retries=0)
    assert good.completions.create(model="llama", prompt="x", max_tokens=2).choices
    assert httpx.get(f"{guarded.url}/health").status_code == 200  # probes need no key


def test_saturation_is_429_with_retry_after(guarded):
    headers = {"Authorization": "Bearer sesame"}
    with httpx.stream(
        "POST", f"{guarded.url}/v1/completions", json={**LONG, "stream": True}, headers=headers
    ) as first:
        lines = first.iter_lines()  # kept: a dropped iterator closes the stream
        line = next(lines)  # the first request is in flight
        assert line.startswith("data: {") and first.status_code == 200, line
        r = httpx.post(f"{guarded.url}/v1/completions", json={"prompt": "x"}, headers=headers)
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["type"] == "rate_limit_error"
    # the closed stream frees the slot
    assert wait_until(
        lambda: (
            httpx.post(
                f"{guarded.url}/v1/completions",
                json={"prompt": "x", "max_tokens": 2},
                headers=headers,
            ).status_code
            == 200
        )
    )


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
        assert httpx.get(f"{proc.url}/health").status_code == 503
        assert httpx.get(f"{proc.url}/workers").json()[0]["healthy"] is False
    finally:
        proc.stop()


def _decode_state(serve) -> tuple[str, float]:
    (decode,) = serve.workers("decode")
    aborted = metric_value(
        httpx.get(decode["metrics_url"]).text, "tandem_request_success_total", finish_reason="abort"
    )
    return decode["url"], aborted


def _clean(url: str) -> bool:
    kv = httpx.get(f"{url}/debug/kv").json()
    return kv["requests"] == 0 and kv["in_use"] == 0 and kv["held"] == 0


def test_a_closed_stream_aborts_the_request_downstream(serve):
    url, aborted = _decode_state(serve)
    with httpx.stream("POST", f"{serve.url}/v1/completions", json={**LONG, "stream": True}) as r:
        lines = r.iter_lines()
        chunk = json.loads(next(line for line in lines if line)[len("data: ") :])
        assert chunk["choices"][0]["finish_reason"] is None
    assert wait_until(lambda: _decode_state(serve)[1] == aborted + 1)
    (prefill,) = serve.workers("prefill")
    assert wait_until(lambda: _clean(url) and _clean(prefill["url"]))


def test_a_client_that_gives_up_aborts_a_non_streamed_request(serve):
    url, aborted = _decode_state(serve)
    start = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{serve.url}/v1/completions", json={**LONG, "n": 2}, timeout=0.5)
    assert wait_until(lambda: _decode_state(serve)[1] == aborted + 2)
    assert wait_until(lambda: _clean(url))
    assert time.monotonic() - start < 20
