"""The router's event loop under a long prompt: inter-token gaps of short streams, with and
without 100,000-character prompts sent beside them.

A real router (`python -P -m tandem.router`, the tiny generated model's tokenizer) over one
fake decode node (a process of its own: it streams one record every `--interval` seconds
and answers the health checks). `--streams` streamed completions of `--tokens` tokens run
at once; in the "long" case chat requests of `--chars` characters are sent one after
another for as long as the streams last (one long prompt in flight at any time), each
rendered by the chat template, tokenized and hashed by the router. Prints the gaps between
consecutive chunks of the short streams (p50, p99, max, over `--rounds` rounds).

`--tree DIR` runs the router from another checkout (the code before a change).

    python -P bench/router_loop.py [--tree /tmp/old] [--router-arg=--cpu-workers=4] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

sys.path.insert(0, str(Path(__file__).resolve().parent))

from local_serve import wait_ready
from machine import describe_host

from tandem.engine.api.ports import free_port
from tandem.router.serve import ensure_model


def fake_node(interval: float) -> FastAPI:
    """A decode node's HTTP face: `/health`, and `/generate` streaming `max_tokens`
    records, one per `interval` seconds."""
    api = FastAPI()

    @api.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse({"role": "decode", "agent": "fake-decode"})

    @api.post("/abort")
    async def abort() -> JSONResponse:
        return JSONResponse({})

    @api.post("/generate")
    async def generate(request: Request) -> StreamingResponse:
        body = await request.json()
        num_tokens, num_prompt = body["sampling"]["max_tokens"], len(body["token_ids"])

        async def records():
            for i in range(1, num_tokens + 1):
                await asyncio.sleep(interval)
                rec = {"token_ids": [7], "text": "x", "logprobs": None, "finish_reason": None}
                if i == num_tokens:
                    usage = {"prompt_tokens": num_prompt, "completion_tokens": num_tokens}
                    rec |= {"finish_reason": "length", "stop_reason": None, "usage": usage}
                yield json.dumps(rec) + "\n"

        return StreamingResponse(records(), media_type="application/x-ndjson")

    return api


@contextmanager
def process(command: list[str], env: dict[str, str]):
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=log)
        try:
            yield proc, log
        finally:
            proc.terminate()
            proc.wait(60)


@contextmanager
def router(args: argparse.Namespace):
    """The fake node and a router over it, ready: the router's base URL."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with ExitStack() as stack:
        if args.tree:  # `tandem` imported from the other tree, ahead of this one
            links = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            (links / "tandem").symlink_to(Path(args.tree).resolve())
            env["PYTHONPATH"] = str(links)
        node_port, port = free_port(), free_port()
        node = [sys.executable, "-P", __file__, "--fake-node", str(node_port)]
        node += ["--interval", str(args.interval)]
        stack.enter_context(process(node, env))
        command = [
            sys.executable, "-P", "-m", "tandem.router", "--model", str(ensure_model(None)),
            "--port", str(port), "--log-level", "warning", "--policy", "round-robin",
            "--max-model-len", "1000000", "--decode", f"http://127.0.0.1:{node_port}",
            *args.router_arg,
        ]  # fmt: skip
        proc, log = stack.enter_context(process(command, env))
        base = f"http://127.0.0.1:{port}"
        wait_ready(base, proc, log, 1)
        yield base


async def short_stream(client: httpx.AsyncClient, base: str, num_tokens: int) -> list[float]:
    """The gaps (seconds) between consecutive chunks of one streamed completion."""
    body = {"prompt": "Hello there", "max_tokens": num_tokens, "stream": True}
    arrivals = []
    async with client.stream("POST", f"{base}/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                arrivals.append(time.perf_counter())
    return [b - a for a, b in itertools.pairwise(arrivals)]


async def long_prompts(client: httpx.AsyncClient, base: str, chars: int, done) -> int:
    """Long chat requests one after another until `done` is set; how many were answered."""
    text = ("The quick brown fox jumps over the lazy dog, 42 times. " * chars)[:chars]
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": 1}
    num = 0
    while not done.is_set():
        r = await client.post(f"{base}/v1/chat/completions", json=body)
        r.raise_for_status()
        num += 1
    return num


async def one_round(base: str, args: argparse.Namespace, long: bool) -> tuple[list[float], int]:
    limits = httpx.Limits(max_connections=args.streams + 2)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        await short_stream(client, base, 2)  # connections and the router warm
        done = asyncio.Event()
        background = asyncio.create_task(
            long_prompts(client, base, args.chars, done) if long else asyncio.sleep(0, 0)
        )
        streams = [short_stream(client, base, args.tokens) for _ in range(args.streams)]
        gaps = [g for found in await asyncio.gather(*streams) for g in found]
        done.set()
        return gaps, await background


def summary(gaps: list[float]) -> str:
    ms = sorted(g * 1e3 for g in gaps)
    p99 = ms[min(len(ms) - 1, int(0.99 * len(ms)))]
    return f"p50 {statistics.median(ms):7.1f} ms  p99 {p99:7.1f} ms  max {ms[-1]:7.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=200, help="per short stream")
    parser.add_argument("--interval", type=float, default=0.01, help="seconds per token")
    parser.add_argument("--chars", type=int, default=100_000, help="of each long prompt")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tree", default=None, help="run the router from this checkout")
    parser.add_argument("--router-arg", action="append", default=[], help="a router flag")
    parser.add_argument("--smoke", action="store_true", help="tiny: that it runs at all")
    parser.add_argument("--fake-node", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        args.streams, args.tokens, args.chars, args.rounds = 2, 5, 5000, 1
    if args.fake_node is not None:
        uvicorn.run(fake_node(args.interval), port=args.fake_node, log_level="error")
        return
    print(f"command: python -P {' '.join(sys.argv)}")
    print(subprocess.check_output(["uname", "-a"], text=True).strip())
    print(f"nproc {len(os.sched_getaffinity(0))}")
    print(f"machine: {describe_host()}; router from {args.tree or 'this tree'}")
    with router(args) as base:
        for long in (False, True):
            gaps, num_long = [], 0
            for _ in range(args.rounds):
                found, num = asyncio.run(one_round(base, args, long))
                gaps += found
                num_long += num
            label = f"with {num_long} long prompts" if long else "alone"
            print(f"{args.streams} streams {label:<22} {len(gaps):5d} gaps  {summary(gaps)}")


if __name__ == "__main__":
    main()
