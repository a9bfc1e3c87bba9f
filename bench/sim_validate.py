"""The simulator against the real system: replay a scaled-down trace on a real
`tandem serve` (router, prefill and decode processes on this machine), then simulate the
same requests with a device profile, and print the error of TTFT and TPOT p50/p90 and of
throughput.

    OMP_NUM_THREADS=1 python -P bench/sim_validate.py --num-requests 120 --length-scale 32 \\
        --time-scale 1 --profile cpu

Prompts are the trace's, mapped to token ids as `tandem simulate` maps them; every request
streams with `ignore_eos`, so both sides produce the trace's output lengths exactly.

With `--fit-requests N` the first N requests of the trace are a calibration slice, replayed
for real; what is fitted on it depends on `--fit-overhead` (no latency is ever fitted; the
validation slice is the `--num-requests` after it, never seen by the fit):
- `log` (default): every node's step log of the slice (`GET /debug/steps`). The engine
  profile's constants are fitted on the model runner's own CPU time per step, both roles
  together (`sim.calibration.fit_logged_profile`: the engine as it ran inside the
  deployment, where `bench/calibrate.py` times it alone); each role's work outside the
  runner (scheduling, detokenizing, streaming records, KV events) is fitted per step and per
  sequence from the process's CPU over back-to-back steps (`fit_host_overhead`, into
  `decode_*` / `prefill_*_overhead_s`); a role whose steps seldom run back to back (the
  prefill workers, whose loops wait for writes after most steps) gets its process's CPU
  beyond the runner shared out per step (`fit_role_overhead`).
- `step` / `token`: the CPU time the decode processes spent beyond the simulated engine time
  (from /proc), charged per decode step (`step_overhead_s`) or per token
  (`token_overhead_s`), on the shipped profile.

With `--background-load measured` the simulated host also runs the work that is not
simulated, as `host_background_load`: the cores kept busy during the real validation run
(/proc/stat) less what the simulation will run itself: with `log`, each logged step's
runner CPU plus its role's fitted work outside the runner, and the router's and client's
CPU (each a single-threaded process in the simulation), leaving the nodes' work between
steps, other tenants and the supervisor; otherwise less the prefill and decode processes'
CPU (`step`, `token`, or no fit slice). The simulated nodes share the host's cores with it
and with each other in time slices (`--cores sliced`, `sim/sliced_cores.py`: the kernel's
slice measured before each run, `proc_stats.time_slice`, and with `log` each engine
thread's run inside its steps from the step logs' switch counts) or evenly
(`--cores shared`, processor sharing, `sim/shared_cores.py`); each run is simulated both
ways and both tables printed.

Besides the latencies it prints what the decode nodes measured themselves (their mean
inter-token latency, their steps) and the CPU seconds of each process of the deployment,
against the simulated engine time.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for tests.disagg.nodes

from forward_probe import forward_cpu
from local_serve import local_serve, node_headers, worker_entries
from machine import describe_host
from proc_stats import cpu_seconds, host_busy, thread_seconds, time_slice
from replay_client import refused, replay, sent_only

from tandem.engine.engine_args import EngineArgs
from tandem.engine.exec.model_shard import kv_block_bytes
from tandem.engine.tiny_model import make_model
from tandem.router.phase_metrics import PHASES
from tandem.sim.calibration import (
    UNBOUNDED_RATE,
    Spread,
    engine_run_length,
    fit_host_overhead,
    fit_logged_profile,
    fit_other_threads,
    fit_role_overhead,
    fit_spread,
    mean_tail,
    step_residuals,
)
from tandem.sim.cluster import ClusterConfig
from tandem.sim.interference import fit_interference, prefill_overlaps, without_interference
from tandem.sim.profiles import DeviceProfile, load_profile
from tandem.sim.results import SLO, summarize
from tandem.sim.shapes import load_shape
from tandem.sim.simulate import run_cluster
from tandem.sim.traces import read_trace
from tandem.sim.workload import SimRequest, fit_lengths, scale_load
from tests.disagg.nodes import metric_value

TRACE = "/work/shared/traces/mooncake_conversation_trace.jsonl"
# Steps whose runner times correlate less than this from one to the next get the measured
# spread in the simulation (`independent`).
INDEPENDENT_LAG = 0.3


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
    p.add_argument(
        "--kv-host-blocks", type=int, default=0,
        help="a host KV tier of this many blocks on every node, real and simulated",
    )  # fmt: skip
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--port", type=int, default=18080)
    p.add_argument("--fit-requests", type=int, default=0, help="calibration slice size")
    p.add_argument(
        "--fit-overhead",
        choices=("log", "step", "token"),
        default="log",
        help="log: the engine profile and each role's work outside the model, fitted on the "
        "nodes' step logs; step/token: the decode processes' CPU beyond the profile's "
        "engine time, per step or per token",
    )
    p.add_argument(
        "--background-load",
        default="none",
        help="other tenants' busy cores on this host: a number, 'measured' (during the real "
        "run, from /proc/stat less the deployment's own CPU) or 'none'",
    )
    p.add_argument("--repeat", type=int, default=1, help="real runs (fresh deployments)")
    p.add_argument("--seed", type=int, default=0, help="the simulation's draws (steps' spread)")
    p.add_argument(
        "--sim-seeds",
        type=int,
        default=5,
        help="simulations per run where the steps spread (seeds from --seed); figures are "
        "their medians",
    )
    p.add_argument(
        "--max-load",
        type=float,
        default=0.0,
        help="before each run, wait (at most 15 min) until the 1-minute load average is "
        "below this (0: do not wait)",
    )
    p.add_argument(
        "--cores",
        choices=("sliced", "shared"),
        default="sliced",
        help="the simulated host's cores: in time slices (the kernel's, measured before each "
        "run, and the engine threads' runs from the step logs) or shared evenly; the other "
        "is simulated too and its errors printed",
    )
    p.add_argument("--out", default=None, help="write every run's figures as JSON")
    return p.parse_args()


def figures(ttft: list[float], tpot: list[float], duration: float, n: int) -> dict[str, float]:
    return {
        "ttft_p50": float(np.percentile(ttft, 50)),
        "ttft_p90": float(np.percentile(ttft, 90)),
        "tpot_p50": float(np.percentile(tpot, 50)),
        "tpot_p90": float(np.percentile(tpot, 90)),
        "throughput_rps": n / duration,
    }


def host_tier_gib(model: str, num_blocks: int) -> float:
    """GiB that hold `num_blocks` of the nodes' KV blocks (their dtype on this machine),
    with a hair more so rounding down to whole blocks keeps them all."""
    if not num_blocks:
        return 0.0
    config = EngineArgs(model, num_kv_blocks=1).create_config()
    return num_blocks * kv_block_bytes(config) / 2**30 * 1.0001


def run_real(args, model: str, slices: list[list[SimRequest]]) -> list[dict[str, float]]:
    """Replay each slice on one `tandem serve`, one after the other."""
    command = [
        sys.executable, "-P", "-m", "tandem.cli", "serve", "--model", model,
        "--prefill", str(args.prefill), "--decode", str(args.decode), "--policy", args.policy,
        "--remote-prefill-threshold", str(args.threshold), "--port", str(args.port),
        "--num-kv-blocks", str(args.num_kv_blocks), "--max-model-len", str(args.max_model_len),
        "--threads", "1", "--debug-endpoints",  # the nodes' step logs: /debug/steps
        "--kv-host-gib", repr(host_tier_gib(model, args.kv_host_blocks)),
    ]  # fmt: skip
    base = f"http://127.0.0.1:{args.port}"
    # the router's forwarding, on a router of its own (the same flags as serve's)
    router_args = ["--policy", args.policy, "--max-model-len", str(args.max_model_len)]
    forward_s = forward_cpu(model, [*router_args, "--log-level", "warning"])
    with local_serve(command, base, args.prefill + args.decode) as proc:
        return _replay_slices(base, proc.pid, slices, forward_s)


def _replay_slices(
    base: str, root: int, slices: list[list[SimRequest]], forward_s: float
) -> list[dict]:
    # untimed: first steps, and the decode nodes' connections to the prefill workers
    warm = [SimRequest.of_tokens(f"w{i}", 0.0, [7 + i] * 64, 4) for i in range(8)]
    asyncio.run(replay(base, warm))
    relay = relay_probe(base, root, forward_s)
    out = []
    for requests in slices:
        phases_before, last_steps = router_phases(base), last_step_seqs(base)
        before, cpu_before, host_before = node_counters(base), cpu_seconds(root), host_busy()
        delay_before = thread_seconds(root, 1)
        figures = _figures(requests, *asyncio.run(replay(base, requests)))
        delay_after = thread_seconds(root, 1)
        after, cpu_after, host_after = node_counters(base), cpu_seconds(root), host_busy()
        figures["cpu_s"] = {k: cpu_after[k] - cpu_before.get(k, 0.0) for k in cpu_after}
        figures["run_delay_s"] = {k: v - delay_before.get(k, 0.0) for k, v in delay_after.items()}
        figures["host_busy_s"] = host_after - host_before
        # everything on the host but the nodes: other tenants, the router, the client
        cpu = figures["cpu_s"]
        others = host_after - host_before - cpu.get("decode", 0.0) - cpu.get("prefill", 0.0)
        figures["background_cores"] = max(0.0, others) / figures["duration_s"]
        figures["tenant_cores"] = (
            max(0.0, host_after - host_before - sum(cpu.values())) / (figures["duration_s"])
        )
        gaps = after["itl_count"] - before["itl_count"]
        figures["node_itl_mean"] = (after["itl_sum"] - before["itl_sum"]) / max(gaps, 1)
        figures["decode_steps"] = after["steps"] - before["steps"]
        phases = router_phases(base)
        figures["phase_mean_s"] = {
            k: (phases[k][0] - phases_before[k][0]) / max(phases[k][1] - phases_before[k][1], 1)
            for k in phases
        }
        figures["relay_probe"] = relay
        figures["step_log"] = node_steps(base, last_steps)
        out.append(figures)
    return out


def _figures(requests: list[SimRequest], results: list[dict], duration: float) -> dict:
    assert all(r["tokens"] == q.num_output_tokens for r, q in zip(results, requests))
    later = [r for r in results if r["tokens"] > 1]
    tpot = [(r["e2e"] - r["ttft"]) / (r["tokens"] - 1) for r in later]
    out = figures([r["ttft"] for r in results], tpot, duration, len(results))
    out["duration_s"] = duration
    out["tpot_token_mean"] = sum(r["e2e"] - r["ttft"] for r in later) / sum(
        r["tokens"] - 1 for r in later
    )
    out["requests"] = [[r["ttft"], r["e2e"], r["tokens"]] for r in results]  # in order
    return out


def node_counters(base: str) -> dict[str, float]:
    """Summed over the decode nodes: their inter-token latency histogram (sum, count) and
    their engine steps (`tandem_iteration_tokens_total` observations)."""
    out = {"itl_sum": 0.0, "itl_count": 0.0, "steps": 0.0}
    for w in worker_entries(httpx.get(f"{base}/workers", timeout=10).json()):
        if w["role"] != "decode":
            continue
        text = httpx.get(w["metrics_url"], timeout=10).text
        out["itl_sum"] += metric_value(text, "tandem_inter_token_latency_seconds_sum")
        out["itl_count"] += metric_value(text, "tandem_inter_token_latency_seconds_count")
        out["steps"] += metric_value(text, "tandem_iteration_tokens_total_count")
    return out


def relay_probe(
    base: str, root: int, forward_s: float, num_requests: int = 24, long: int = 65
) -> dict:
    """The router's and the client's CPU each, per request and per token relayed: the same
    prompts (320 tokens) served with 1 output token and with `long`, a few at a time, their
    CPU over each set (the router's threads' to the nanosecond, `thread_seconds`, where
    clock ticks would round a set's difference by more than the figure; the client's, this
    process, from `time.process_time`); per token is the difference over the extra tokens,
    per request what the 1-token set cost beyond a set of one request (a set's own cost,
    the HTTP client's start and the model lookup, would be charged to every request) less
    its token. Of that, the part before the request moves on is, for the router, what one
    it refuses after parsing costs, counted the same way (`max_tokens` beyond the context:
    the parse and the prompt's checks, without routing and the forwarding call), and for the
    client what sending one costs (`sent_cpu`: a refused request's cost would include
    reading and parsing the answer, which a streamed request does only later; charged
    before forwarding, it held a burst's later requests back in the simulated client by
    about twice what sending takes). Of the router's rest, `forward_s` (routing and
    forwarding beyond parsing, `forward_probe.forward_cpu`) is its turn after the
    decision; what remains (`finish_s`) is charged when the request ends."""

    def cpu_of(num_output: int, n: int = num_requests) -> dict[str, float]:
        requests = [
            SimRequest.of_tokens(f"probe{num_output}-{i}", 0.05 * i, [11 + i % 7] * 320, num_output)
            for i in range(n)
        ]
        before = {}

        def start() -> None:  # after the connections opened and the bodies were encoded
            before.update(thread_seconds(root, 0), client=time.process_time())

        send = replay if num_output else refused
        asyncio.run(send(base, requests, start))
        after = {**thread_seconds(root, 0), "client": time.process_time()}
        return {k: after[k] - before.get(k, 0.0) for k in ("router", "client", "decode_http")}

    # a first set, not counted: in the first run of a session the client's first streamed
    # set cost it about 10 ms more per request (warming), which came out as per-request
    # work and none per token
    cpu_of(1)
    short, longer, parsed = cpu_of(1), cpu_of(long), cpu_of(0)
    one_short, one_parsed = cpu_of(1, 1), cpu_of(0, 1)
    parsed["client"], one_parsed["client"] = sent_cpu(num_requests), sent_cpu(1)
    out, extra = {}, num_requests - 1

    def per_token_and_request(k: str) -> tuple[float, float]:
        token_s = max(0.0, longer[k] - short[k]) / (num_requests * (long - 1))
        return token_s, max(0.0, (short[k] - one_short[k]) / extra - token_s)

    for k in ("router", "client"):
        token_s, request_s = per_token_and_request(k)
        before = min(request_s, max(0.0, parsed[k] - one_parsed[k]) / extra)
        out[k] = {"request_s": before, "finish_s": request_s - before, "token_s": token_s}
    forward_s = min(forward_s, out["router"]["finish_s"])
    out["router"] |= {"forward_s": forward_s, "finish_s": out["router"]["finish_s"] - forward_s}
    # the decode nodes' HTTP threads (no refused request reaches them): all of a request's
    # work there is charged before its engine takes it; their work per record is in the
    # decode steps' fitted overhead (the process's CPU over back-to-back steps)
    out["decode"] = {"request_s": per_token_and_request("decode_http")[1]}
    return out


def sent_cpu(n: int) -> float:
    """The client's CPU to send `n` of the probe's prompts (320 tokens, 0.05 s apart) to a
    server that never answers (`replay_client.sent_only`)."""
    requests = [
        SimRequest.of_tokens(f"sent-{i}", 0.05 * i, [11 + i % 7] * 320, 1) for i in range(n)
    ]
    return asyncio.run(sent_only(requests))


def router_phases(base: str) -> dict[str, tuple[float, float]]:
    """The router's per-request phases so far (`tandem_request_phase_seconds`): (sum, count)."""
    text = httpx.get(f"{base}/metrics", timeout=10).text
    name = "tandem_request_phase_seconds"
    return {
        phase: (
            metric_value(text, f"{name}_sum", phase=phase),
            metric_value(text, f"{name}_count", phase=phase),
        )
        for phase in PHASES
    }


def step_background(real: dict, profile: DeviceProfile) -> float:
    """Busy cores of everything on the host during `real`'s slice that the fitted
    `profile` does not simulate: host CPU less each logged step's runner CPU and the
    role's fitted work outside it, and less the router's and client's CPU (simulated as
    processes of their own). The nodes' work between steps, other tenants and the
    supervisor remain."""
    simulated = 0.0
    for role, steps in real["step_log"].values():
        step_s, seq_s = profile.host_overhead(role)
        simulated += sum(r["execute_cpu_s"] + step_s + seq_s * r["num_seqs"] for r in steps)
    cpu = real["cpu_s"]
    simulated += cpu.get("router", 0.0) + cpu.get("client", 0.0)
    simulated += len(real["requests"]) * profile.host_decode_request_s  # the nodes' HTTP
    return max(0.0, real["host_busy_s"] - simulated) / real["duration_s"]


def last_step_seqs(base: str) -> dict[str, int]:
    """Every node's last step number so far, by URL (no records fetched)."""
    out = {}
    for w in worker_entries(httpx.get(f"{base}/workers", timeout=10).json()):
        # a step number no node reaches: only the last seq comes back
        reply = httpx.get(
            f"{w['url']}/debug/steps", params={"since": 2**62}, timeout=10, headers=node_headers()
        )
        out[w["url"]] = reply.json()["last"]
    return out


def node_steps(base: str, since: dict[str, int]) -> dict[str, tuple[str, list[dict]]]:
    """Every node's logged steps (`GET /debug/steps`) after step `since[url]`, by URL with
    its role; all of them (the log dropped none)."""
    out = {}
    for w in worker_entries(httpx.get(f"{base}/workers", timeout=10).json()):
        first = since.get(w["url"], 0)
        reply = httpx.get(
            f"{w['url']}/debug/steps", params={"since": first}, timeout=10, headers=node_headers()
        ).json()
        steps = reply["steps"]
        assert not steps or steps[0]["seq"] == first + 1, f"{w['url']} dropped steps"
        out[w["url"]] = (w["role"], steps)
    return out


def run_sim(args, model: str, profile, requests: list[SimRequest]) -> dict:
    """The simulation of `requests`, once per seed where the profile draws a step spread
    (`--sim-seeds` of them from `--seed`): each figure the median over the seeds (a single
    draw of the steps moves a p90 by several percent), the requests' own times the first
    seed's."""
    draws = any(profile.step_spread(role)[1] for role in ("decode", "prefill"))
    seeds = range(args.seed, args.seed + (args.sim_seeds if draws else 1))
    return median_of([simulate_once(args, model, profile, requests, seed) for seed in seeds])


def median_of(sims: list[dict]) -> dict:
    """Each number (and each number of a mapping) the median over `sims`; anything else
    the first one's."""
    out = {}
    for key, value in sims[0].items():
        if isinstance(value, dict):
            out[key] = {k: float(np.median([s[key][k] for s in sims])) for k in value}
        elif isinstance(value, (int, float)):
            out[key] = float(np.median([s[key] for s in sims]))
        else:
            out[key] = value
    return out


def simulate_once(args, model: str, profile, requests: list[SimRequest], seed: int) -> dict:
    config = ClusterConfig(
        num_prefill=args.prefill,
        num_decode=args.decode,
        policy=args.policy,
        remote_prefill_threshold=args.threshold,
        num_kv_blocks=args.num_kv_blocks,
        max_model_len=args.max_model_len,
        kv_host_blocks=args.kv_host_blocks,
    )
    cluster, records = run_cluster(config, load_shape(model), profile, requests, seed=seed)
    s = summarize(cluster, records, SLO())
    return {
        "requests": [  # in arrival order, as the real ones
            [
                _since(r.first_token_s, r.arrival_s),
                _since(r.finish_s, r.arrival_s),
                r.num_output_tokens,
            ]
            for r in records
        ],
        "ttft_p50": s["ttft_s"]["p50"],
        "ttft_p90": s["ttft_s"]["p90"],
        "tpot_p50": s["tpot_s"]["p50"],
        "tpot_p90": s["tpot_s"]["p90"],
        "throughput_rps": s["throughput_rps"],
        "tpot_token_mean": s["tpot_token_mean_s"],
        "decode_steps": s["pools"]["decode"]["steps"],
        "phase_mean_s": s["phase_mean_s"],
        "prefill_steps": _batching(s["pools"]["prefill"]),
        "busy_s": {
            role: s["pools"][role]["busy_mean"] * s["pools"][role]["nodes"] * s["duration_s"]
            for role in ("decode", "prefill")
            if s["pools"][role]["nodes"]
        },
    }


def _batching(pool: dict) -> dict[str, float]:
    """A pool's steps, those of a single request, and the mean requests per step."""
    steps = pool.get("steps", 0)
    return {
        "steps": steps,
        "of_one": pool.get("steps_of_one", 0),
        "mean": pool.get("batch_mean", 0.0),
    }


def logged_batching(step_log: dict[str, tuple[str, list[dict]]]) -> dict[str, float]:
    """The same as `_batching` from the real prefill workers' step logs."""
    sizes = [r["num_seqs"] for r in _steps_of(step_log, "prefill")]
    mean = sum(sizes) / len(sizes) if sizes else 0.0
    return {"steps": len(sizes), "of_one": sizes.count(1), "mean": mean}


def _since(t: float | None, start: float) -> float | None:
    return None if t is None else t - start


def fit_from_logs(model: str, profile, real: dict) -> tuple[DeviceProfile, dict[str, str]]:
    """The engine's constants fitted on the model runner's CPU time of every logged step of
    the calibration slice (both roles), each role's work outside the runner per step and
    per sequence from its measured cycles, and the router's and client's CPU per request
    and per token relayed (`relay_probe`, before the slice). No latency is fitted."""
    logs, shape = real["step_log"], load_shape(model)
    decode = _steps_of(logs, "decode")
    prefill = _steps_of(logs, "prefill")
    fit = fit_logged_profile(decode + prefill, shape, profile)
    # the decode steps' runner CPU as if no prefill step ran beside them, then the engine
    # refitted on that (`sim.interference`)
    overlaps = {  # per decode node, in the order of `decode`
        url: prefill_overlaps(steps, prefill)
        for url, (role, steps) in logs.items()
        if role == "decode"
    }
    k = fit_interference(decode, [x for xs in overlaps.values() for x in xs], shape, fit.profile)
    alone = dict(logs)
    if k:
        for url, node_overlaps in overlaps.items():
            alone[url] = ("decode", without_interference(logs[url][1], node_overlaps, k))
        fit = fit_logged_profile(_steps_of(alone, "decode") + prefill, shape, profile)
    fitted = dataclasses.replace(fit.profile, host_interference=k)
    record = {
        "engine_median_error": f"{100 * fit.median_rel_error:.1f}%",
        "attention": _attention(fitted.attention_efficiency),
        "interference": f"{100 * k:.1f}% per prefill step",
    }
    spreads = {role: role_spread(alone, role, shape, fitted) for role in ("decode", "prefill")}
    record["spread"] = _spread_record(spreads)
    fitted = dataclasses.replace(fitted, **spread_fields(spreads))
    for role in ("decode", "prefill"):
        mine = _steps_of(logs, role)
        step_s, seq_s = fit_role_overhead(mine, real["cpu_s"].get(role, 0.0))
        if role == "decode":
            record["decode_threads"] = _threads(mine)
        run_s = engine_run_length(mine)
        fitted = dataclasses.replace(
            fitted,
            **{
                f"{role}_step_overhead_s": step_s,
                f"{role}_seq_overhead_s": seq_s,
                f"host_{role}_run_s": run_s,
            },
        )
        tail = mean_tail(mine)
        record[role] = (
            f"{1e3 * step_s:.3f} ms + {1e3 * seq_s:.3f} ms/seq, runs {1e3 * run_s:.2f} ms"
            + ("" if tail is None else f", loop after the runner {1e3 * tail:.2f} ms/step")
        )
    for process, cost in real["relay_probe"].items():  # router, client, decode (HTTP)
        if process == "decode":
            record["decode_http"] = f"{1e3 * cost['request_s']:.2f} ms/request"
        else:
            first = "before routing" if process == "router" else "sending"
            parts = [f"{1e3 * cost['request_s']:.2f} ms/request {first}"]
            if "forward_s" in cost:
                parts.append(f"{1e3 * cost['forward_s']:.2f} ms forwarding")
            parts.append(f"{1e3 * cost['finish_s']:.2f} ms at its end")
            parts.append(f"{1e3 * cost['token_s']:.3f} ms/token")
            record[process] = " + ".join(parts)
        fitted = dataclasses.replace(fitted, **{f"host_{process}_{k}": v for k, v in cost.items()})
    return fitted, record


def _threads(records: list[dict]) -> str:
    """A decode node's work outside the runner by thread, where its cycles measured the
    engine thread's CPU: the engine thread's own, the other threads' (mostly the HTTP
    thread streaming the step's records). Printed only: the simulation charges all of it
    to the steps (docs/notes/performance-2026-11-simulator.md, 2026-11-26, "A decode
    node's HTTP thread")."""
    other = fit_other_threads(records)
    if not any(other):
        return "not measured"
    engine = fit_host_overhead(records, clock="cycle_thread_cpu_s")
    return (
        f"engine thread {1e3 * engine[0]:.3f} ms + {1e3 * engine[1]:.3f} ms/seq, other "
        f"threads {1e3 * other[0]:.3f} ms + {1e3 * other[1]:.3f} ms/token"
    )


def role_spread(
    logs: dict[str, tuple[str, list[dict]]], role: str, shape, profile: DeviceProfile
) -> Spread:
    """A role's steps around the fitted model (`sim.calibration.fit_spread`), each node's
    in its log's order (decode steps as if no prefill step ran beside them: the
    interference the simulation models apart)."""
    per_node = [step_residuals(steps, shape, profile) for r, steps in logs.values() if r == role]
    return fit_spread(per_node)


def _steps_of(logs: dict[str, tuple[str, list[dict]]], role: str) -> list[dict]:
    """A role's steps, node after node."""
    return [r for role_of, steps in logs.values() if role_of == role for r in steps]


def independent(lag: float) -> bool:
    """Whether steps whose residuals correlate by `lag` from one to the next vary
    independently enough for the simulation's independent draws (`sim/step_spread.py`): a
    decode node's slow steps come in spells (lag 0.6-0.8 here), its prompt steps do not
    (mostly under 0.1)."""
    return lag < INDEPENDENT_LAG


def spread_fields(spreads: dict[str, Spread]) -> dict[str, float]:
    """The profile's spread fields for the roles whose steps vary independently."""
    fields = {}
    for role, spread in spreads.items():
        if independent(spread.lag):
            fields[f"{role}_step_scale"] = spread.scale
            fields[f"{role}_step_spread"] = spread.sigma
    return fields


def _spread_record(spreads: dict[str, Spread]) -> str:
    return ", ".join(
        f"{role} x{s.scale:.3f}, spread {s.sigma:.3f} (lag-1 {s.lag:+.2f}"
        + ("" if independent(s.lag) else ", in spells: not simulated")
        + ")"
        for role, s in spreads.items()
    )


def _attention(efficiency: float) -> str:
    """The fitted attention rate, or why there is none (its term dropped by the fit)."""
    if efficiency >= UNBOUNDED_RATE:
        return "not fitted (no attention cost in these steps)"
    return f"{efficiency:.2f} of the weight products' FLOP/s"


def fit_overhead(
    args, model: str, profile, requests, real: dict
) -> tuple[DeviceProfile, dict[str, str]]:
    """The decode node's work outside the model (scheduling, detokenizing, streaming the
    records, which bench/calibrate.py does not time) from CPU accounting on a calibration
    slice: the CPU seconds the decode processes spent beyond the simulated engine time (on
    unshared cores), per step they ran (`step_overhead_s`) or per token they produced
    (`token_overhead_s`), as `--fit-overhead` says. No latency is fitted. Also each role's
    CPU seconds against its simulated engine time alone, for the record."""
    alone = dataclasses.replace(profile, token_overhead_s=0.0, step_overhead_s=0.0, host_cores=0)
    engine = run_sim(args, model, alone, requests)["busy_s"]
    cpu = real["cpu_s"]
    record = {role: f"{cpu.get(role, 0.0):.2f}/{engine[role]:.2f}" for role in engine}
    extra = max(0.0, cpu.get("decode", 0.0) - engine["decode"])
    if args.fit_overhead == "step":
        steps = max(real["decode_steps"], 1)
        return dataclasses.replace(profile, step_overhead_s=extra / steps), record
    tokens = sum(r.num_output_tokens - 1 for r in requests)  # the first comes from prefill
    return dataclasses.replace(profile, token_overhead_s=extra / max(tokens, 1)), record


def _slice(trace: list[SimRequest], start: int, n: int) -> list[SimRequest]:
    """Requests start..start+n, their arrivals shifted to begin at 0."""
    part = trace[start : start + n]
    t0 = part[0].arrival_s
    return [dataclasses.replace(r, arrival_s=r.arrival_s - t0) for r in part]


FIGURES = ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90", "throughput_rps")


def wait_quiet(max_load: float, bound_s: float = 900.0) -> None:
    """Until the 1-minute load average is below `max_load` (0: do not wait), at most
    `bound_s`; a run on a busy host measures the other tenants."""
    deadline = time.monotonic() + bound_s
    while max_load and os.getloadavg()[0] >= max_load and time.monotonic() < deadline:
        time.sleep(5)


def one_run(args, model: str, profile, fit_slice, requests) -> dict:
    """One real deployment (fresh `tandem serve`) replaying the fit slice and the
    validation slice, the profile fitted on the first, and the simulation of the second."""
    wait_quiet(args.max_load)
    slice_s = time_slice()
    load_before = os.getloadavg()
    reals = run_real(args, model, [s for s in (fit_slice, requests) if s])
    load_after = os.getloadavg()
    record = {}
    if fit_slice and args.fit_overhead == "log":
        profile, record = fit_from_logs(model, profile, reals[0])
    elif fit_slice:
        profile, record = fit_overhead(args, model, profile, fit_slice, reals[0])
    real = reals[-1]
    if args.background_load == "measured":  # the other tenants, during the real run
        if fit_slice and args.fit_overhead == "log":
            background = step_background(real, profile)
        else:
            background = real["background_cores"]
        profile = dataclasses.replace(profile, host_background_load=background)
    sliced = dataclasses.replace(profile, host_time_slice_s=slice_s)
    shared = dataclasses.replace(profile, host_time_slice_s=0.0)
    profile, other = (sliced, shared) if args.cores == "sliced" else (shared, sliced)
    return {
        "real": real,
        "sim": run_sim(args, model, profile, requests),
        "sim_other": run_sim(args, model, other, requests),
        "time_slice_s": slice_s,
        "fit_cpu": record,
        "fit_step_log": reals[0]["step_log"] if fit_slice else {},
        "fit_cpu_s": reals[0]["cpu_s"] if fit_slice else {},
        "load_before": load_before[0],
        "load_after": load_after[0],
        "step_overhead_s": profile.step_overhead_s,
        "token_overhead_s": profile.token_overhead_s,
        "profile": dataclasses.asdict(profile),
        "host_background_load": profile.host_background_load,
    }


def spread(values: list[float]) -> tuple[float, float, float]:
    """Median, min and max."""
    return float(np.median(values)), min(values), max(values)


def summary_table(runs: list[dict], sim: str = "sim") -> list[str]:
    """Per figure: the real median and its run-to-run range, the simulated median and
    range, the error of the simulated median against the real median, and the range of
    the paired (same run) errors. `sim`: which simulation ("sim_other": the other way of
    sharing the cores)."""
    lines = [
        "| figure | real median [min-max] | simulated median [min-max] | error of medians "
        "| paired errors [min-max] |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for key in (*FIGURES, "tpot_token_mean", "decode_steps"):
        unit = 1.0 if key in ("throughput_rps", "decode_steps") else 1e3
        real = spread([unit * r["real"][key] for r in runs])
        simulated = spread([unit * r[sim][key] for r in runs])
        paired = [100 * (r[sim][key] / r["real"][key] - 1) for r in runs]
        lines.append(
            f"| {key} | {real[0]:.2f} [{real[1]:.2f}-{real[2]:.2f}] "
            f"| {simulated[0]:.2f} [{simulated[1]:.2f}-{simulated[2]:.2f}] "
            f"| {100 * (simulated[0] / real[0] - 1):+.1f}% "
            f"| {min(paired):+.1f}% to {max(paired):+.1f}% |"
        )
    return lines


def phase_table(runs: list[dict], sim: str = "sim") -> list[str]:
    """Per phase of the router's split of a request (`tandem_request_phase_seconds`): the
    real and simulated medians over the runs of its mean, and the error of the medians."""
    lines = [
        "| phase (mean, ms) | real median [min-max] | simulated median [min-max] | error |",
        "| --- | ---: | ---: | ---: |",
    ]
    for phase in PHASES:
        real = [1e3 * r["real"]["phase_mean_s"][phase] for r in runs]
        simulated = [1e3 * r[sim]["phase_mean_s"].get(phase, 0.0) for r in runs]
        (rm, rlo, rhi), (sm, slo, shi) = spread(real), spread(simulated)
        error = f"{100 * (sm / rm - 1):+.1f}%" if rm else "-"
        lines.append(
            f"| {phase} | {rm:.2f} [{rlo:.2f}-{rhi:.2f}] | {sm:.2f} [{slo:.2f}-{shi:.2f}] "
            f"| {error} |"
        )
    return lines


def batching_table(runs: list[dict], sim: str = "sim") -> list[str]:
    """The prefill workers' steps (both together), real and simulated medians over the
    runs: how many, how many ran a single request, and the mean requests per step. How
    the prompts that reach a worker group into steps is not timed by a model constant,
    so a difference here is one of structure (docs/performance.md)."""
    lines = [
        "| prefill steps | real median [min-max] | simulated median [min-max] |",
        "| --- | ---: | ---: |",
    ]
    for key, label in (
        ("steps", "steps"),
        ("of_one", "of one request"),
        ("mean", "requests per step"),
    ):
        real = spread([logged_batching(r["real"]["step_log"])[key] for r in runs])
        simulated = spread([r[sim]["prefill_steps"][key] for r in runs])
        lines.append(
            f"| {label} | {real[0]:.2f} [{real[1]:.2f}-{real[2]:.2f}] "
            f"| {simulated[0]:.2f} [{simulated[1]:.2f}-{simulated[2]:.2f}] |"
        )
    return lines


def print_run(i: int, run: dict) -> None:
    real, sim = run["real"], run["sim"]
    figs = ", ".join(
        f"{k} {(1 if k == 'throughput_rps' else 1e3) * real[k]:.2f}/"
        f"{(1 if k == 'throughput_rps' else 1e3) * sim[k]:.2f}"
        for k in FIGURES
    )
    cpu = real["cpu_s"]
    print(
        f"run {i + 1}: load {run['load_before']:.2f} -> {run['load_after']:.2f}; "
        f"step_overhead_s {1e3 * run['step_overhead_s']:.2f} ms, token_overhead_s "
        f"{1e3 * run['token_overhead_s']:.2f} ms, background {run['host_background_load']:.2f} "
        f"cores (other tenants {real['tenant_cores']:.2f}); time slice "
        f"{1e3 * run['time_slice_s']:.2f} ms; fit slice CPU / engine alone "
        f"s: {run['fit_cpu']}; real/sim (ms, req/s): {figs}; decode nodes' own ITL "
        f"{1e3 * real['node_itl_mean']:.2f} ms; CPU s over {real['duration_s']:.1f} s: "
        + ", ".join(f"{k} {v:.1f}" for k, v in sorted(cpu.items()))
        + "; run-queue waits s: "
        + ", ".join(f"{k} {v:.2f}" for k, v in sorted(real.get("run_delay_s", {}).items()))
        + "; simulated engine s: "
        + ", ".join(f"{k} {v:.1f}" for k, v in run["sim"]["busy_s"].items()),
        flush=True,
    )


def main() -> None:
    args = parse_args()
    if args.sim_seeds < 1:
        raise SystemExit("error: --sim-seeds must be at least 1")
    profile = load_profile(args.profile)
    if args.background_load not in ("measured", "none"):
        profile = dataclasses.replace(profile, host_background_load=float(args.background_load))
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(make_model(Path(tmp) / "small", size="small"))
        vocab = load_shape(model).vocab_size
        total = args.fit_requests + args.num_requests
        trace = read_trace(args.trace, vocab, total, args.length_scale)
        trace = fit_lengths(scale_load(trace, args.time_scale), args.max_model_len)
        fit_slice = _slice(trace, 0, args.fit_requests) if args.fit_requests else []
        requests = _slice(trace, args.fit_requests, args.num_requests)
        print(f"command: python -P bench/sim_validate.py {' '.join(sys.argv[1:])}")
        print(f"machine: {describe_host()}")
        if fit_slice:
            print(
                f"fit slice: requests 0-{args.fit_requests - 1} (--fit-overhead "
                f"{args.fit_overhead}), replayed first in every run"
            )
        print(f"validation: requests {args.fit_requests}-{total - 1}, prompt tokens "
              f"{sum(r.num_prompt_tokens for r in requests)}, output tokens "
              f"{sum(r.num_output_tokens for r in requests)}", flush=True)  # fmt: skip
        for i in range(args.repeat):
            runs.append(one_run(args, model, profile, fit_slice, requests))
            print_run(i, runs[-1])
    print(f"{len(runs)} runs, each a fresh deployment; 1-minute load average before each: "
          + ", ".join(f"{r['load_before']:.2f}" for r in runs)
          + "; after: " + ", ".join(f"{r['load_after']:.2f}" for r in runs))  # fmt: skip
    print("\n".join(summary_table(runs)))
    print("\nwhere the time to first token went, by the router's phases:")
    print("\n".join(phase_table(runs)))
    print("\nhow the prefill workers batched the prompts:")
    print("\n".join(batching_table(runs)))
    other = "shared evenly" if args.cores == "sliced" else "in time slices"
    print(f"\nthe same runs simulated with the host's cores {other}:")
    print("\n".join(summary_table(runs, "sim_other")))
    if args.out:
        Path(args.out).write_text(json.dumps(runs, indent=2))


if __name__ == "__main__":
    main()
