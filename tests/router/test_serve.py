"""`tandem serve` as a supervisor: the default model it writes, a pool without prefill
workers (decode prefills locally), and everything stopping when one child dies."""

from __future__ import annotations

import subprocess

import openai

from tandem.router.serve import ensure_model
from tests.router.conftest import ServeProc


def test_without_a_model_it_writes_the_small_one_once(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = ensure_model(None)
    assert path == tmp_path / "tandem" / "tiny-llama"
    assert (path / "config.json").is_file() and (path / "tokenizer.json").is_file()
    stamp = (path / "config.json").stat().st_mtime_ns
    assert ensure_model(None) == path and (path / "config.json").stat().st_mtime_ns == stamp


def test_a_dying_child_stops_everything(llama_dir, router_logs):
    serve = ServeProc(llama_dir, router_logs, "--prefill", "0", "--decode", "1",
                      "--max-model-len", "256", "--num-kv-blocks", "64")  # fmt: skip
    try:
        serve.start().wait_ready(timeout=120)
        client = openai.OpenAI(base_url=f"{serve.url}/v1", api_key="x", max_retries=0)
        r = client.completions.create(
            model="llama", prompt="Hi", max_tokens=3, extra_body={"ignore_eos": True}
        )
        assert r.usage.completion_tokens == 3  # no prefill worker: the decode node prefilled
        children = subprocess.run(
            ["pgrep", "-P", str(serve.proc.pid)], capture_output=True, text=True
        ).stdout.split()
        assert len(children) == 2  # the decode node and the router
        subprocess.run(["kill", "-9", children[0]], check=True)
        assert serve.proc.wait(30) == 1
        alive = subprocess.run(["ps", "-o", "pid=", "-p", ",".join(children)], capture_output=True)
        assert alive.stdout.strip() == b""  # the other child was stopped too
    finally:
        serve.stop()
