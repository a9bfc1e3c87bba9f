"""The clients of the fault soak (`bench/soak.py`): who asks what (streamed or not, n=1 or
2, leaving mid-stream or not), one request sent and its outcome classified, every request
bounded by a time only a hang reaches, and the load at a fixed concurrency.

Outcomes: `completed` (every choice's tokens, `finish_reason` `length`, usage checked),
`disconnected` (the client left on purpose), `error_status` (an OpenAI error body with a
non-200 status), `error_event` (an SSE error event), `unclear` (anything else: a dropped
connection, a truncated stream, a missing `[DONE]`), `hung` (the bound tripped).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import dataclass

import httpx
from serve import make_prompts  # bench/serve.py

OUTCOMES = ("completed", "disconnected", "error_status", "error_event", "unclear", "hung")


@dataclass(frozen=True)
class Spec:
    """One client: its prompt, whether it streams, `n`, and after how many chunks it
    leaves (None: it stays to the end)."""

    index: int
    prompt: list[int]
    stream: bool
    n: int
    leave_after: int | None


@dataclass
class Outcome:
    kind: str  # one of OUTCOMES
    detail: str = ""
    e2e: float = 0.0
    stream: bool = False
    n: int = 1


def make_specs(args: argparse.Namespace) -> list[Spec]:
    rng = random.Random(args.seed + 7)
    specs = []
    for i, prompt in enumerate(make_prompts(args)):
        leaves = rng.random() < args.disconnect_fraction
        stream = leaves or rng.random() < args.stream_fraction
        n = 2 if rng.random() < args.n2_fraction else 1
        leave_after = rng.randint(1, max(1, args.output_len // 2)) if leaves else None
        specs.append(Spec(i, prompt, stream, n, leave_after))
    return specs


def probe_specs(args: argparse.Namespace) -> list[Spec]:
    """Sequential non-streamed requests with fresh prompts, for after the load: the
    policy's tie rotation spreads them over every worker."""
    fresh = argparse.Namespace(**{**vars(args), "seed": args.seed + 1, "num_requests": args.probes})
    return [Spec(-1 - i, p, False, 1, None) for i, p in enumerate(make_prompts(fresh))]


def request_body(spec: Spec, args: argparse.Namespace) -> dict:
    body = {
        "prompt": spec.prompt, "max_tokens": args.output_len, "n": spec.n, "temperature": 0.0,
        "ignore_eos": True, "stream": spec.stream,
    }  # fmt: skip
    if spec.stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def send(http: httpx.AsyncClient, url: str, spec: Spec, args: argparse.Namespace) -> Outcome:
    """One request, classified. Never raises for what the server does."""
    try:
        async with http.stream("POST", url, json=request_body(spec, args)) as r:
            if r.status_code != 200:
                await r.aread()
                return status_outcome(r)
            if not spec.stream:
                await r.aread()
                return answer_outcome(r.json(), spec, args)
            return await stream_outcome(r, spec, args)
    except (httpx.HTTPError, ValueError) as exc:  # the connection broke, or bad JSON
        return Outcome("unclear", f"transport: {type(exc).__name__}: {str(exc)[:100]}")


def status_outcome(r: httpx.Response) -> Outcome:
    try:
        error = r.json()["error"]
        return Outcome("error_status", f"HTTP {r.status_code} {error['type']}")
    except (ValueError, KeyError, TypeError):
        return Outcome("unclear", f"HTTP {r.status_code} without an error body: {r.text[:80]}")


def answer_outcome(body: dict, spec: Spec, args: argparse.Namespace) -> Outcome:
    reasons = [c.get("finish_reason") for c in body.get("choices", [])]
    return finished_outcome(reasons, body.get("usage"), spec, args)


def finished_outcome(
    reasons: list, usage: dict | None, spec: Spec, args: argparse.Namespace
) -> Outcome:
    expected = spec.n * args.output_len
    got = (usage or {}).get("completion_tokens")
    if reasons == ["length"] * spec.n and got == expected:
        return Outcome("completed")
    return Outcome("unclear", f"finish reasons {reasons}, {got} of {expected} tokens")


async def stream_outcome(r: httpx.Response, spec: Spec, args: argparse.Namespace) -> Outcome:
    reasons: list = [None] * spec.n
    usage, chunks = None, 0
    async for line in r.aiter_lines():
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            return finished_outcome(reasons, usage, spec, args)
        data = json.loads(line[6:])
        if "error" in data:
            return Outcome("error_event", f"SSE error event {data['error'].get('type')}")
        for choice in data.get("choices", []):
            reasons[choice["index"]] = choice.get("finish_reason") or reasons[choice["index"]]
        usage = data.get("usage") or usage
        chunks += bool(data.get("choices"))
        if spec.leave_after is not None and chunks >= spec.leave_after:
            return Outcome("disconnected")  # leaving the block closes the connection
    return Outcome("unclear", "the stream ended without [DONE]")


async def bounded(http: httpx.AsyncClient, url: str, spec: Spec, args) -> Outcome:
    """`send`, counted as hung (and given up) once it takes `--hang-timeout`."""
    start = time.perf_counter()
    try:
        out = await asyncio.wait_for(send(http, url, spec, args), args.hang_timeout)
    except TimeoutError:
        out = Outcome("hung", f"no end after {args.hang_timeout:g} s")
    out.e2e, out.stream, out.n = time.perf_counter() - start, spec.stream, spec.n
    return out


@dataclass
class Progress:
    done: int = 0


async def run_load(
    http: httpx.AsyncClient, url: str, specs: list[Spec], args, progress: Progress
) -> list[Outcome]:
    gate = asyncio.Semaphore(args.concurrency)

    async def one(spec: Spec) -> Outcome:
        async with gate:
            out = await bounded(http, url, spec, args)
        progress.done += 1
        return out

    return await asyncio.gather(*(one(s) for s in specs))
