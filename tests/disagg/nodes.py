"""Test helpers: real prefill and decode node processes on 127.0.0.1, and a client."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from tandem.engine.api.deployment_token import ENV as TOKEN_ENV
from tandem.engine.api.deployment_token import DeploymentToken
from tandem.engine.api.ports import free_port
from tests.bounds import HANG_S, PROCESS_S


class Proc:
    """One server process on 127.0.0.1; `start()` returns at once, `wait_ready()` waits for
    `ready_path` to answer 200. Subclasses say what to run (`command`)."""

    name = "proc"
    ready_path = "/health"

    def __init__(self, log_dir: Path, http_port: int | None = None) -> None:
        self.log_dir = log_dir
        self.http_port = http_port or free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        """Variables added to this process's environment."""
        return {}

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.name}-{self.http_port}.log"

    def log_tail(self, lines: int = 40) -> str:
        """The end of this process's output, for an error that says why it stopped."""
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"

    def start(self) -> Proc:
        log = open(self.log_path, "ab")  # noqa: SIM115
        env = {**os.environ, "OMP_NUM_THREADS": "1", **self.environment()}
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        return self

    def wait_ready(self, timeout: float = PROCESS_S) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            try:
                # a probe: one that times out is simply tried again
                r = httpx.get(f"{self.url}{self.ready_path}", timeout=2)
                if r.status_code == 200:
                    return r.json() if "json" in r.headers.get("content-type", "") else {}
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"{self.name} not ready in {timeout}s")

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=HANG_S).text

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(HANG_S)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


class Node(Proc):
    """A prefill or decode node process."""

    def __init__(
        self, role: str, model: Path, log_dir: Path, *extra: str, env: dict | None = None
    ) -> None:
        super().__init__(log_dir)
        self.role = self.name = role
        self.model = model
        self.extra = extra
        self.env = env or {}
        self.zmq_port = free_port()
        self.metrics_port = free_port()

    def environment(self) -> dict[str, str]:
        return self.env

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.zmq_port}"

    def command(self) -> list[str]:
        return [
            sys.executable, "-P", "-m", f"tandem.{self.role}_node",
            "--model", str(self.model),
            "--http-port", str(self.http_port), "--zmq-port", str(self.zmq_port),
            "--metrics-port", str(self.metrics_port),
            "--threads", "1", "--dtype", "float32", "--log-level", "warning", "--debug-endpoints",
            *self.extra,
        ]  # fmt: skip

    @property
    def headers(self) -> dict[str, str]:
        """What a caller of its control routes sends: the node's token, if it has one."""
        return DeploymentToken(self.env.get(TOKEN_ENV, os.environ.get(TOKEN_ENV, ""))).headers()

    def metrics(self) -> str:
        """From the metrics port: the control port serves no /metrics."""
        return httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=HANG_S).text

    def kv(self) -> dict:
        return httpx.get(f"{self.url}/debug/kv", timeout=HANG_S, headers=self.headers).json()


@contextlib.contextmanager
def running(nodes: dict[str, Proc]) -> Iterator[dict[str, Proc]]:
    """Start every process, wait until all are ready; stop them all on the way out."""
    try:
        start_all(*nodes.values())
        yield nodes
    finally:
        for node in nodes.values():
            node.stop()


def start_all(*nodes: Proc) -> None:
    for node in nodes:
        node.start()
    for node in nodes:
        node.wait_ready()


def generate(
    decode: Node,
    request_id: str,
    token_ids: list[int],
    sampling: dict,
    prefill: Node | None = None,
    alternates: tuple[Node, ...] = (),
    timeout: float = HANG_S,
    headers: dict[str, str] | None = None,
) -> tuple[list[int], str, dict]:
    """Stream one request; returns (token ids, text, final record)."""
    body = {
        "request_id": request_id,
        "token_ids": token_ids,
        "sampling": sampling,
        "prefill": prefill.endpoint if prefill else None,
        "prefill_alternates": [n.endpoint for n in alternates],
    }
    tokens, text, last = [], "", {}
    url = f"{decode.url}/generate"
    with httpx.stream("POST", url, json=body, timeout=timeout, headers=headers) as r:
        if r.status_code != 200:
            r.read()
            return [], "", {"status": r.status_code, **r.json()}
        for line in r.iter_lines():
            last = json.loads(line)
            tokens += last["token_ids"]
            text += last["text"]
    return tokens, text, last


def connect(decode: Node, prefill: Node) -> None:
    """Send small requests through `prefill` until one is served there, not failed over: the
    decode node's connection to it is then up. (The node waits only briefly for a new
    connection, so on a busy machine a first request may go elsewhere.) A paused worker then
    keeps a request waiting rather than being refused as unreachable."""
    greedy = {"max_tokens": 2, "temperature": 0.0, "ignore_eos": True}

    def served_there() -> bool:
        before = metric_value(decode.metrics(), "tandem_prefill_fallbacks_total")
        request_id = f"warm-{prefill.http_port}-{time.monotonic()}"
        generate(decode, request_id, [5, 6], greedy, prefill)
        return metric_value(decode.metrics(), "tandem_prefill_fallbacks_total") == before

    assert wait_until(served_there), f"{prefill.url} never served a request"


def metric_value(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels` (0 when absent)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, value = line.rsplit(" ", 1)
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def wait_until(predicate, timeout: float = HANG_S, interval: float = 0.1) -> bool:
    """Poll until `predicate()` holds; `timeout` is a bound only a hang reaches."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def assert_clean(*nodes: Node) -> None:
    """Every invariant holds (the node checks), nothing in use, held or pending."""
    for node in nodes:
        wait_until(lambda n=node: n.kv()["in_use"] == 0 and n.kv()["requests"] == 0)
        report = node.kv()
        assert report["in_use"] == 0 and report["held"] == 0, (node.role, report)
        assert report["requests"] == 0, (node.role, report)
        assert report["free"] + report["cached"] == report["total"], (node.role, report)
