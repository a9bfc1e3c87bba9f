"""Load generator for any OpenAI-compatible endpoint (Tandem's router, or another server),
or for a Tandem decode node's token API directly (to measure what the router adds).

    python bench/serve.py --base-url http://127.0.0.1:8000/v1 --num-requests 500 --concurrency 64
    python bench/serve.py --request-rate 20 --dataset shared-prefix --prefix-len 256
    python bench/serve.py --decode-url http://127.0.0.1:PORT --prefill-endpoint tcp://...

Prompts are token ids (random, or a few shared prefixes plus random suffixes), streamed
with `ignore_eos` so every request produces exactly `--output-len` tokens. Prints the
command, the machine and a table (TTFT, inter-token latency, end-to-end percentiles,
throughput, goodput under `--slo-ttft`/`--slo-itl`); `--out` writes the same as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field

import httpx


@dataclass
class Result:
    ok: bool
    ttft: float = 0.0
    itls: list[float] = field(default_factory=list)
    e2e: float = 0.0
    output_tokens: int = 0
    error: str = ""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    p.add_argument("--decode-url", default=None, help="a decode node: bypass the router")
    p.add_argument("--prefill-endpoint", default=None, help="with --decode-url: remote prefill")
    p.add_argument("--model", default=None, help="default: the first of /v1/models")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"))
    p.add_argument("--num-requests", type=int, default=500)
    p.add_argument("--concurrency", type=int, default=64, help="requests in flight at most")
    p.add_argument("--request-rate", type=float, default=float("inf"), help="Poisson, req/s")
    p.add_argument("--dataset", choices=("random", "shared-prefix"), default="random")
    p.add_argument("--input-len", type=int, default=64, help="prompt tokens (suffix if shared)")
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--prefix-len", type=int, default=128, help="shared-prefix tokens")
    p.add_argument("--num-prefixes", type=int, default=4)
    p.add_argument("--vocab-size", type=int, default=500, help="token ids drawn below this")
    p.add_argument("--slo-ttft", type=float, default=None, help="milliseconds")
    p.add_argument("--slo-itl", type=float, default=None, help="milliseconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the results as JSON here")
    return p.parse_args(argv)


def make_prompts(args: argparse.Namespace) -> list[list[int]]:
    rng = random.Random(args.seed)

    def draw(n: int) -> list[int]:
        return [rng.randrange(10, args.vocab_size) for _ in range(n)]

    if args.dataset == "random":
        return [draw(args.input_len) for _ in range(args.num_requests)]
    prefixes = [draw(args.prefix_len) for _ in range(args.num_prefixes)]
    return [rng.choice(prefixes) + draw(args.input_len) for _ in range(args.num_requests)]


class Target:
    """Where requests go: an OpenAI server's /completions, or a decode node's /generate."""

    def __init__(self, args: argparse.Namespace, http: httpx.AsyncClient) -> None:
        self.args = args
        self.http = http
        self.headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}

    async def model(self) -> str:
        if self.args.model or self.args.decode_url:
            return self.args.model or ""
        r = await self.http.get(f"{self.args.base_url}/models", headers=self.headers)
        return r.json()["data"][0]["id"]

    def request(self, model: str, prompt: list[int]) -> tuple[str, dict]:
        a = self.args
        if a.decode_url:
            sampling = {"max_tokens": a.output_len, "ignore_eos": True, "temperature": 0}
            body = {
                "request_id": uuid.uuid4().hex,
                "token_ids": prompt,
                "sampling": sampling,
                "prefill": a.prefill_endpoint,
            }
            return f"{a.decode_url}/generate", body
        body = {
            "model": model, "prompt": prompt, "max_tokens": a.output_len, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
        }  # fmt: skip
        return f"{a.base_url}/completions", body

    @staticmethod
    def tokens_in(line: str) -> int | None:
        """Tokens a streamed line carries (None: not a data line)."""
        if line.startswith("data: "):
            line = line[6:]
            if line == "[DONE]":
                return None
            data = json.loads(line)
            if "error" in data:
                raise RuntimeError(data["error"].get("message", "error event"))
            choices = data.get("choices") or []
            return 1 if choices and choices[0].get("text") is not None else 0
        if line.startswith("{"):  # a decode node's NDJSON record
            record = json.loads(line)
            if record.get("error"):
                raise RuntimeError(record["error"])
            return len(record["token_ids"])
        return None


async def one(target: Target, model: str, prompt: list[int]) -> Result:
    url, body = target.request(model, prompt)
    start = time.perf_counter()
    last, result = None, Result(ok=False)
    try:
        async with target.http.stream("POST", url, json=body, headers=target.headers) as r:
            if r.status_code != 200:
                await r.aread()
                return Result(ok=False, error=f"{r.status_code}: {r.text[:120]}")
            async for line in r.aiter_lines():
                n = Target.tokens_in(line)
                if not n:
                    continue
                now = time.perf_counter()
                if last is None:
                    result.ttft = now - start
                else:
                    result.itls.append(now - last)
                last = now
                result.output_tokens += n
        result.e2e = time.perf_counter() - start
        result.ok = result.output_tokens > 0
    except (httpx.HTTPError, RuntimeError, ValueError) as exc:
        result.error = repr(exc)[:160]
    return result


async def run(args: argparse.Namespace) -> tuple[list[Result], float]:
    prompts = make_prompts(args)
    limits = httpx.Limits(max_connections=args.concurrency + 8)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600, connect=10), limits=limits) as http:
        target = Target(args, http)
        model = await target.model()
        gate = asyncio.Semaphore(args.concurrency)
        rng = random.Random(args.seed + 1)

        async def limited(prompt: list[int]) -> Result:
            async with gate:
                return await one(target, model, prompt)

        start = time.perf_counter()
        tasks = []
        for prompt in prompts:
            tasks.append(asyncio.create_task(limited(prompt)))
            if args.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(args.request_rate))
        results = await asyncio.gather(*tasks)
        return results, time.perf_counter() - start


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0}
    s = sorted(values)

    def pick(q: float) -> float:
        return s[min(len(s) - 1, int(q * len(s)))]

    return {"mean": sum(s) / len(s), "p50": pick(0.5), "p90": pick(0.9), "p99": pick(0.99)}


def summarize(args: argparse.Namespace, results: list[Result], duration: float) -> dict:
    ok = [r for r in results if r.ok]
    tokens = sum(r.output_tokens for r in ok)
    slo_ttft = args.slo_ttft / 1000 if args.slo_ttft else float("inf")
    slo_itl = args.slo_itl / 1000 if args.slo_itl else float("inf")
    good = [r for r in ok if r.ttft <= slo_ttft and all(i <= slo_itl for i in r.itls)]
    errors = [r.error for r in results if not r.ok]
    return {
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} CPUs, "
        f"{platform.system()} {platform.release()}",
        "target": args.decode_url or args.base_url,
        "requests": len(results),
        "errors": len(errors),
        "first_errors": errors[:5],
        "duration_s": duration,
        "request_throughput": len(ok) / duration,
        "output_token_throughput": tokens / duration,
        "goodput_req_s": len(good) / duration,
        "ttft_ms": {k: v * 1000 for k, v in percentiles([r.ttft for r in ok]).items()},
        "itl_ms": {k: v * 1000 for k, v in percentiles([i for r in ok for i in r.itls]).items()},
        "e2e_ms": {k: v * 1000 for k, v in percentiles([r.e2e for r in ok]).items()},
        "args": vars(args),
    }


def table(summary: dict) -> str:
    lines = [
        f"command: {summary['command']}",
        f"machine: {summary['machine']}",
        f"target:  {summary['target']}",
        f"requests {summary['requests']}, errors {summary['errors']}, "
        f"{summary['duration_s']:.1f} s, {summary['request_throughput']:.2f} req/s, "
        f"{summary['output_token_throughput']:.1f} output tok/s, "
        f"goodput {summary['goodput_req_s']:.2f} req/s",
        f"{'ms':<6}{'mean':>9}{'p50':>9}{'p90':>9}{'p99':>9}",
    ]
    for name in ("ttft_ms", "itl_ms", "e2e_ms"):
        row = summary[name]
        lines.append(
            f"{name[:-3]:<6}{row['mean']:>9.1f}{row['p50']:>9.1f}{row['p90']:>9.1f}{row['p99']:>9.1f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    results, duration = asyncio.run(run(args))
    summary = summarize(args, results, duration)
    print(table(summary))
    if summary["first_errors"]:
        print("first errors:", *summary["first_errors"], sep="\n  ")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({**summary, "results": [asdict(r) for r in results]}, f, indent=1)


if __name__ == "__main__":
    main()
