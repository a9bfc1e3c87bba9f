"""`tandem serve`: the router, N prefill and M decode processes on this machine.

The embedded default and the first thing a newcomer runs. Without `--model` it writes the
small random checkpoint once (into the user cache) and serves that. Every request is
disaggregated (remote-prefill threshold 0) so the real path runs: router -> decode node ->
prefill node over ZMQ -> KV blocks over NIXL -> decode. Ctrl-C (or SIGTERM) stops every
child; so does any child dying.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tandem.router.cli import POLICY_NAMES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="model folder (default: a generated one)")
    parser.add_argument("--prefill", type=int, default=1, help="prefill processes")
    parser.add_argument("--decode", type=int, default=1, help="decode processes")
    parser.add_argument("--port", type=int, default=8000, help="the router's port")
    parser.add_argument("--host", default="127.0.0.1", help="the router's address")
    parser.add_argument("--policy", choices=POLICY_NAMES, default="kv-aware")
    parser.add_argument(
        "--remote-prefill-threshold", type=int, default=0, help="0: disaggregate every request"
    )
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--num-kv-blocks", type=int, default=None, help="per node")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per node")
    parser.add_argument("--log-level", default="warning", help="children's log level")
    parser.add_argument("--ready-timeout", type=float, default=300.0, help="seconds")


@dataclass
class Child:
    name: str
    cmd: list[str]
    url: str
    extra: str = ""
    proc: subprocess.Popen | None = field(default=None, repr=False)


def default_model_dir() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "tandem" / "tiny-llama"


def ensure_model(model: str | None) -> Path:
    """The model folder to serve; the generated checkpoint when none is given."""
    if model is not None:
        return Path(model)
    path = default_model_dir()
    if not (path / "config.json").is_file():
        from tandem.engine.tiny_model import make_model

        print(f"generating a small random model in {path} ...", flush=True)
        make_model(path)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def plan(args: argparse.Namespace, model: Path) -> list[Child]:
    """The command line of every child: prefill nodes, decode nodes, then the router."""
    python = [sys.executable, "-P", "-m"]
    common = ["--model", str(model), "--threads", str(args.threads), "--log-level", args.log_level]
    for flag in ("max_model_len", "num_kv_blocks"):
        if getattr(args, flag) is not None:
            common += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    children = []
    for role, count in (("prefill", args.prefill), ("decode", args.decode)):
        for i in range(count):
            http, zmq_port = free_port(), free_port()
            cmd = [*python, f"tandem.{role}_node", *common]
            cmd += ["--http-port", str(http), "--zmq-port", str(zmq_port)]
            if role == "decode":
                cmd += ["--remote-prefill-threshold", str(args.remote_prefill_threshold)]
            label = "ZMQ requests" if role == "prefill" else "KV events"
            url = f"http://127.0.0.1:{http}"
            children.append(Child(f"{role}-{i}", cmd, url, f"{label} tcp://127.0.0.1:{zmq_port}"))
    router = [*python, "tandem.router", "--model", str(model), "--host", args.host]
    router += ["--port", str(args.port), "--policy", args.policy, "--log-level", args.log_level]
    if args.max_model_len is not None:
        router += ["--max-model-len", str(args.max_model_len)]
    router += ["--prefill", *(c.url for c in children if c.name.startswith("prefill"))]
    router += ["--decode", *(c.url for c in children if c.name.startswith("decode"))]
    children.append(Child("router", router, f"http://{args.host}:{args.port}"))
    return children


class Supervisor:
    """Starts the children, waits until the router is ready, and stops them all together."""

    def __init__(self, children: list[Child]) -> None:
        self.children = children

    def start(self) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        for child in self.children:
            child.proc = subprocess.Popen(child.cmd, env=env)

    def dead(self) -> Child | None:
        return next((c for c in self.children if c.proc.poll() is not None), None)

    def wait_ready(self, router: Child, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (child := self.dead()) is not None:
                raise RuntimeError(f"{child.name} exited with {child.proc.returncode}")
            try:
                if httpx.get(f"{router.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"not ready after {timeout:.0f}s")

    def stop(self) -> None:
        for child in self.children:
            if child.proc and child.proc.poll() is None:
                child.proc.terminate()
        deadline = time.monotonic() + 10
        for child in self.children:
            if child.proc is None:
                continue
            try:
                child.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.proc.kill()
                child.proc.wait()


def banner(children: list[Child], model_name: str) -> str:
    router = children[-1]
    lines = [f"Tandem is serving {model_name} at {router.url}/v1", ""]
    lines += [f"  {c.name:<10} {c.url}  {c.extra}".rstrip() for c in children]
    lines += [
        "",
        "Try:",
        f"  curl {router.url}/v1/completions -H 'Content-Type: application/json' \\",
        f'    -d \'{{"model": "{model_name}", "prompt": "Hello", "max_tokens": 16}}\'',
        "",
        "Workers and their load: " + f"{router.url}/workers    Ctrl-C stops everything.",
    ]
    return "\n".join(lines)


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> None:
    if args.decode < 1 or args.prefill < 0:
        raise SystemExit("--decode must be at least 1 and --prefill at least 0")
    model = ensure_model(args.model)
    children = plan(args, model)
    supervisor = Supervisor(children)
    signal.signal(signal.SIGTERM, _interrupt)
    code = 0
    try:
        supervisor.start()
        supervisor.wait_ready(children[-1], args.ready_timeout)
        print(banner(children, os.path.basename(os.path.normpath(model))), flush=True)
        while (child := supervisor.dead()) is None:
            time.sleep(0.5)
        print(f"{child.name} exited with {child.proc.returncode}; stopping", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        print("stopping", file=sys.stderr)
    except (RuntimeError, TimeoutError) as exc:
        print(f"tandem serve: {exc}; stopping", file=sys.stderr)
        code = 1
    finally:
        supervisor.stop()
    sys.exit(code)
