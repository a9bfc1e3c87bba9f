"""A real `tandem serve` (router, prefill and decode processes) for the OpenAI-client tests,
and helpers to start extra routers over the same or other workers."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tandem.engine.api.deployment_token import ENV as TOKEN_ENV
from tandem.engine.api.deployment_token import DeploymentToken
from tandem.engine.tiny_model import make_model
from tests.assets import npm_tokenizer
from tests.bounds import HANG_S
from tests.disagg.nodes import Proc

# The deployment token of the tests' `tandem serve` and of the routers over its workers:
# the tests read the nodes' debug views with it (`NODE_HEADERS`).
TOKEN = DeploymentToken("tests-of-the-router-0123456789")
NODE_HEADERS = TOKEN.headers()

SERVE_FLAGS = ("--max-model-len", "512", "--num-kv-blocks", "256", "--log-level", "warning")
# For a module whose prompts carry tool signatures: several hundred tokens with the tiny
# tokenizer, longer than SERVE_FLAGS' server takes.
LONG_PROMPT_FLAGS = ("--max-model-len", "2048", "--num-kv-blocks", "512", "--log-level", "warning")


class ServeProc(Proc):
    """`tandem serve`: its own children on free ports (their debug views on, for the
    tests' censuses); the router on `http_port`."""

    name = "serve"

    def __init__(self, model: Path, log_dir: Path, *extra: str) -> None:
        super().__init__(log_dir)
        self.model, self.extra = model, extra

    def command(self) -> list[str]:
        return [
            sys.executable, "-P", "-m", "tandem.cli", "serve",
            "--model", str(self.model), "--port", str(self.http_port), "--debug-endpoints",
            "--dtype", "float32", *self.extra,
        ]  # fmt: skip

    def environment(self) -> dict[str, str]:
        return {TOKEN_ENV: TOKEN.value}

    def workers(self, role: str | None = None) -> list[dict]:
        found = httpx.get(f"{self.url}/workers", timeout=HANG_S).json()
        return [w for w in found if role is None or w["role"] == role]


class RouterProc(Proc):
    """`tandem router` over static worker URLs."""

    name = "router"
    ready_path = "/metrics"  # /health is 503 until a decode worker is healthy

    def __init__(
        self, model: Path, log_dir: Path, prefill: list[str], decode: list[str], *extra: str
    ) -> None:
        super().__init__(log_dir)
        self.model, self.prefill, self.decode, self.extra = model, prefill, decode, extra

    def environment(self) -> dict[str, str]:
        return {TOKEN_ENV: TOKEN.value}

    def command(self) -> list[str]:
        return [
            sys.executable, "-P", "-m", "tandem.router", "--model", str(self.model),
            "--port", str(self.http_port), "--log-level", "warning",
            "--prefill", *self.prefill, "--decode", *self.decode, *self.extra,
        ]  # fmt: skip


@contextmanager
def serving(model: Path, log_dir: Path, *flags: str) -> Iterator[ServeProc]:
    """A started, ready `tandem serve` of `model` with `flags`, stopped on exit."""
    proc = ServeProc(model, log_dir, *flags)
    try:
        proc.start().wait_ready()
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def router_logs(tmp_path_factory):
    return tmp_path_factory.mktemp("router-logs")


@pytest.fixture(scope="package")
def serve(llama_dir, router_logs):
    with serving(llama_dir, router_logs, "--prefill", "1", "--decode", "1", *SERVE_FLAGS) as p:
        yield p


@pytest.fixture(scope="package")
def qwen3_dir(tmp_path_factory) -> Path:
    """A tiny random Qwen3 with Qwen3's own tokenizer and chat template (its tool calls
    and its thinking switch), served as `qwen3`."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(npm_tokenizer("qwen3"))
    root = tmp_path_factory.mktemp("qwen3-tiny")
    return make_model(root / "qwen3", arch="qwen3", tokenizer=tokenizer)


@pytest.fixture(scope="package")
def qwen3_serve(qwen3_dir, router_logs):
    """`tandem serve` of `qwen3_dir` with the deepseek_r1 reasoning parser (Qwen3
    Thinking-2507's): with thinking on, every reply starts inside its reasoning, so a
    random model's reply is all reasoning; with thinking off (`enable_thinking: false`)
    it has none."""
    flags = ("--prefill", "1", "--decode", "1", "--reasoning-parser", "deepseek_r1")
    limits = ("--max-model-len", "1024", "--num-kv-blocks", "256", "--log-level", "warning")
    with serving(qwen3_dir, router_logs, *flags, *limits) as proc:
        yield proc
