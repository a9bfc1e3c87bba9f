"""The simulator against the real system: replay a scaled-down trace on a real
`tandem serve` (router, prefill and decode processes on this machine), then simulate the
same requests with a device profile, and print the error of TTFT and TPOT p50/p90 and of
throughput.

    OMP_NUM_THREADS=1 python -P bench/sim_validate.py --num-requests 120 --length-scale 32 \\
        --time-scale 1 --profile cpu

Prompts are the trace's, mapped to token ids as `tandem simulate` maps them; every request
streams with `ignore_eos`, so both sides produce the trace's output lengths exactly.

With `--fit-requests N` the first N requests of the trace are a calibration slice: replayed
for real, then the profile's `token_overhead_s` (streaming a token out, which the engine
timing of bench/calibrate.py does not see) is bisected until the simulated TPOT p50 of that
slice matches; the validation slice is the `--num-requests` after it, never seen by the fit.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe_host

from tandem.engine.tiny_model import make_model
from tandem.sim.cluster import ClusterConfig
from tandem.sim.profiles import load_profile
from tandem.sim.results import SLO
from tandem.sim.shapes import load_shape
from tandem.sim.simulate import simulate
from tandem.sim.traces import read_trace
from tandem.sim.workload import SimRequest, fit_lengths, scale_load

TRACE = "/work/shared/traces/mooncake_conversation_trace.jsonl"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--trace", default=TRACE)
    p.add_argument("--model", default=None, help="default: make-model --size small")
    p.add_argument("--profile", default="cpu")
    p.add_argument("--num-requests", type=int, default=120)
    p.add_argument("--length-scale", type=float, default=32.0)
    p.add_argument("--time-scale", type=float, default=1.0, help="load factor on the trace")
    p.add_argument("--prefill", type=int, default=2)
    p.add_argument("--decode", type=int, default=2)
    p.add_argument("--policy", default="kv-aware")
    p.add_argument("--threshold", type=int, default=0)
    p.add_argument("--num-kv-blocks", type=int, default=512)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--port", type=int, default=18080)
    p.add_argument("--fit-requests", type=int, default=0, help="calibration slice size")
    p.add_argument("--out", default=None, help="write both sides' figures as JSON")
    return p.parse_args()


async def replay(base: str, requests: list[SimRequest]) -> tuple[list[dict], float]:
    """Send each request at its arrival time; per request TTFT, end to end, tokens."""
    async with httpx.AsyncClient(timeout=httpx.Timeout(600, connect=10)) as http:
        model = (await http.get(f"{base}/v1/models")).json()["data"][0]["id"]
        start = time.perf_counter()
        t0 = requests[0].arrival_s

        async def one(r: SimRequest) -> dict:
            await asyncio.sleep(max(0.0, r.arrival_s - t0 - (time.perf_counter() - start)))
            body = {
                "model": model, "prompt": r.token_ids(), "max_tokens": r.num_output_tokens,
                "temperature": 0, "ignore_eos": True, "stream": True,
            }  # fmt: skip
            sent = time.perf_counter()
            first, tokens = None, 0
            async with http.stream("POST", f"{base}/v1/completions", json=body) as resp:
                resp.raise_for_status()
                async for line in resp.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    data = json.loads(line[6:])
                    if data.get("choices"):
                        first = first or time.perf_counter()
                        tokens += 1
            done = time.perf_counter()
            return {"ttft": first - sent, "e2e": done - sent, "tokens": tokens, "end": done}

        results = await asyncio.gather(*(one(r) for r in requests))
        return list(results), max(r["end"] for r in results) - start


def figures(ttft: list[float], tpot: list[float], duration: float, n: int) -> dict[str, float]:
    return {
        "ttft_p50": float(np.percentile(ttft, 50)),
        "ttft_p90": float(np.percentile(ttft, 90)),
        "tpot_p50": float(np.percentile(tpot, 50)),
        "tpot_p90": float(np.percentile(tpot, 90)),
        "throughput_rps": n / duration,
    }


def run_real(args, model: str, slices: list[list[SimRequest]]) -> list[dict[str, float]]:
    """Replay each slice on one `tandem serve`, one after the other."""
    command = [
        sys.executable, "-P", "-m", "tandem.engine.cli", "serve", "--model", model,
        "--prefill", str(args.prefill), "--decode", str(args.decode), "--policy", args.policy,
        "--remote-prefill-threshold", str(args.threshold), "--port", str(args.port),
        "--num-kv-blocks", str(args.num_kv_blocks), "--max-model-len", str(args.max_model_len),
        "--threads", "1",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{args.port}"
    try:
        _wait_ready(base, proc, args.prefill + args.decode)
        # untimed: first steps, and the decode nodes' connections to the prefill workers
        warm = [SimRequest.of_tokens(f"w{i}", 0.0, [7 + i] * 64, 4) for i in range(8)]
        asyncio.run(replay(base, warm))
        return [_figures(requests, *asyncio.run(replay(base, requests))) for requests in slices]
    finally:
        proc.terminate()
        proc.wait(60)


def _figures(requests: list[SimRequest], results: list[dict], duration: float) -> dict:
    assert all(r["tokens"] == q.num_output_tokens for r, q in zip(results, requests))
    tpot = [(r["e2e"] - r["ttft"]) / (r["tokens"] - 1) for r in results if r["tokens"] > 1]
    return figures([r["ttft"] for r in results], tpot, duration, len(results))


def _wait_ready(base: str, proc: subprocess.Popen, num_workers: int) -> None:
    """Until the router sees every worker healthy."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"tandem serve exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            workers = httpx.get(f"{base}/workers", timeout=2).json()
            if sum(1 for w in _entries(workers) if w.get("healthy")) == num_workers:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError("tandem serve not ready")


def _entries(workers) -> list[dict]:
    return workers if isinstance(workers, list) else workers.get("workers", [])


def run_sim(args, model: str, profile, requests: list[SimRequest]) -> dict[str, float]:
    config = ClusterConfig(
        num_prefill=args.prefill,
        num_decode=args.decode,
        policy=args.policy,
        remote_prefill_threshold=args.threshold,
        num_kv_blocks=args.num_kv_blocks,
        max_model_len=args.max_model_len,
    )
    s = simulate(config, load_shape(model), profile, requests, SLO())
    return {
        "ttft_p50": s["ttft_s"]["p50"],
        "ttft_p90": s["ttft_s"]["p90"],
        "tpot_p50": s["tpot_s"]["p50"],
        "tpot_p90": s["tpot_s"]["p90"],
        "throughput_rps": s["throughput_rps"],
    }


def fit_token_overhead(args, model: str, profile, requests, real_tpot: float):
    """Bisect `token_overhead_s` in [0, 50 ms] until the simulated TPOT p50 matches."""
    lo, hi = 0.0, 0.05
    for _ in range(12):
        mid = (lo + hi) / 2
        trial = dataclasses.replace(profile, token_overhead_s=mid)
        if run_sim(args, model, trial, requests)["tpot_p50"] < real_tpot:
            lo = mid
        else:
            hi = mid
    return dataclasses.replace(profile, token_overhead_s=(lo + hi) / 2)


def _slice(trace: list[SimRequest], start: int, n: int) -> list[SimRequest]:
    """Requests start..start+n, their arrivals shifted to begin at 0."""
    part = trace[start : start + n]
    t0 = part[0].arrival_s
    return [dataclasses.replace(r, arrival_s=r.arrival_s - t0) for r in part]


def main() -> None:
    args = parse_args()
    profile = load_profile(args.profile)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(make_model(Path(tmp) / "small", size="small"))
        vocab = load_shape(model).vocab_size
        total = args.fit_requests + args.num_requests
        trace = read_trace(args.trace, vocab, total, args.length_scale)
        trace = fit_lengths(scale_load(trace, args.time_scale), args.max_model_len)
        fit_slice = _slice(trace, 0, args.fit_requests) if args.fit_requests else []
        requests = _slice(trace, args.fit_requests, args.num_requests)
        load_before = os.getloadavg()
        reals = run_real(args, model, [s for s in (fit_slice, requests) if s])
        load_after = os.getloadavg()
        if fit_slice:
            profile = fit_token_overhead(args, model, profile, fit_slice, reals[0]["tpot_p50"])
        real = reals[-1]
        sim = run_sim(args, model, profile, requests)
    print(f"command: python -P bench/sim_validate.py {' '.join(sys.argv[1:])}")
    print(f"machine: {describe_host()}")
    print(
        "load average (1, 5, 15 min) before the real run: "
        f"{', '.join(f'{x:.2f}' for x in load_before)}; after: "
        f"{', '.join(f'{x:.2f}' for x in load_after)}"
    )
    if fit_slice:
        print(f"fitted on requests 0-{args.fit_requests - 1}: token_overhead_s "
              f"{1e3 * profile.token_overhead_s:.3f} ms")  # fmt: skip
    print(f"validation: requests {args.fit_requests}-{total - 1}, prompt tokens "
          f"{sum(r.num_prompt_tokens for r in requests)}, output tokens "
          f"{sum(r.num_output_tokens for r in requests)}")  # fmt: skip
    print("| figure | real | simulated | error |")
    print("| --- | ---: | ---: | ---: |")
    for key in real:
        err = (sim[key] - real[key]) / real[key]
        unit = 1e3 if key != "throughput_rps" else 1.0
        print(f"| {key} | {unit * real[key]:.2f} | {unit * sim[key]:.2f} | {100 * err:+.1f}% |")
    if args.out:
        Path(args.out).write_text(json.dumps({"real": real, "sim": sim}, indent=2))


if __name__ == "__main__":
    main()
