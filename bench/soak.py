"""Fault soak: `tandem serve` under load while prefill and decode processes are killed with
SIGKILL and restarted by `tandem serve` itself; counts what every client saw.

    python bench/soak.py --num-requests 2000 --concurrency 64 --prefill 2 --decode 2 \\
        --kill prefill@0.25 --kill decode@0.6 --out soak.json

The load (prompts from `bench/serve.py`) mixes streamed and non-streamed completions,
n=1 and n=2, and clients that go away mid-stream. Every request has a client-side bound
(`--hang-timeout`) that only trips on a hang: a request that reaches it is counted as hung,
not waited for. Each `--kill ROLE@FRACTION` kills one process of that role once that
fraction of the requests is done, and waits until the router sees it back (a new agent).
After the load: a few probe requests (the restarted workers must serve again), then every
node's `/debug/kv` census must balance (nothing in use, held or pending). Failure metrics
are summed over every process that lived: a node's are read just before it is killed.
Prints the command, the machine and the figures; never asserts them.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe_host
from serve import percentiles  # bench/serve.py
from soak_clients import OUTCOMES, Outcome, Progress, bounded, make_specs, probe_specs, run_load
from soak_servers import Ledger, Serve, settle, workers_of


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default=None, help="default: tandem serve's generated model")
    p.add_argument("--prefill", type=int, default=2)
    p.add_argument("--decode", type=int, default=2)
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument("--num-kv-blocks", type=int, default=None, help="per node")
    p.add_argument("--prefill-timeout", type=float, default=None, help="decode nodes' flag")
    p.add_argument("--hold-timeout", type=float, default=None, help="decode nodes' flag")
    p.add_argument("--num-requests", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--vocab-size", type=int, default=500, help="token ids drawn below this")
    p.add_argument("--stream-fraction", type=float, default=0.5, help="of the staying clients")
    p.add_argument("--n2-fraction", type=float, default=0.25, help="requests with n=2")
    p.add_argument("--disconnect-fraction", type=float, default=0.1, help="leave mid-stream")
    p.add_argument(
        "--kill", action="append", default=[], metavar="ROLE@FRACTION",
        help="kill -9 one prefill/decode process once this fraction is done (repeatable)",
    )  # fmt: skip
    p.add_argument("--hang-timeout", type=float, default=180.0, help="per request, seconds")
    p.add_argument("--restart-timeout", type=float, default=180.0, help="per kill, seconds")
    p.add_argument("--settle-timeout", type=float, default=180.0, help="censuses, seconds")
    p.add_argument("--probes", type=int, default=8, help="requests after the load")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log", default=None, help="tandem serve's output (default: a temp file)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    args.dataset, args.kills = "random", [parse_kill(k) for k in args.kill]
    return args


def parse_kill(text: str) -> tuple[str, float]:
    role, _, at = text.partition("@")
    if role not in ("prefill", "decode") or not 0 < float(at or 0) < 1:
        raise SystemExit(f"--kill {text}: expected prefill@F or decode@F with 0 < F < 1")
    return role, float(at)


# -- kills ----------------------------------------------------------------------------------


async def kill_and_wait(http, serve: Serve, role: str, ledger: Ledger, args) -> dict:
    """SIGKILL one `role` node (its metrics read first), then wait until the router sees
    it healthy with a new agent name."""
    pid, port = serve.child(role)
    url = f"http://127.0.0.1:{port}"
    victim = next(w for w in await workers_of(http, serve.url) if w["url"] == url)
    agent = victim["agent"]
    await ledger.scrape(url)
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    event = {
        "role": role, "url": url, "pid": pid, "old_agent": agent, "restarted": False,
        "load_at_kill": victim["load"],
    }  # fmt: skip
    while time.monotonic() - killed < args.restart_timeout:
        try:
            w = next(w for w in await workers_of(http, serve.url) if w["url"] == url)
        except (httpx.HTTPError, ValueError):
            w = {}
        if w.get("healthy") and w.get("agent") not in (None, agent):
            event.update(restarted=True, new_agent=w["agent"])
            break
        await asyncio.sleep(0.1)
    event["seconds_to_healthy"] = round(time.monotonic() - killed, 2)
    return event


async def chaos(http, serve: Serve, ledger: Ledger, progress: Progress, args) -> list[dict]:
    events = []
    for role, at in args.kills:
        while progress.done < at * args.num_requests:
            await asyncio.sleep(0.05)
        after = progress.done
        event = await kill_and_wait(http, serve, role, ledger, args)
        events.append({**event, "after_requests": after})
    return events


async def scrape_loop(http, serve: Serve, ledger: Ledger) -> None:
    """Read every process's metrics every 2 s, so nothing is lost with a process."""
    while True:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            await ledger.scrape_all(await workers_of(http, serve.url))
        await asyncio.sleep(2)


# -- the whole run --------------------------------------------------------------------------


@dataclass
class Run:
    """What one soak saw: each request's outcome, the load's wall time, the kills, the
    probes after the load, the censuses and the workers at the end."""

    outcomes: list[Outcome]
    duration: float
    kills: list[dict]
    probes: list[Outcome]
    census: dict
    workers: list[dict]


async def soak(args: argparse.Namespace, serve: Serve) -> tuple[Run, Ledger]:
    limits = httpx.Limits(max_connections=args.concurrency + 16)
    timeout = httpx.Timeout(None, connect=10)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as http:
        await serve.wait_ready(http, args.prefill + args.decode, timeout=600)
        ledger, progress, specs = Ledger(http), Progress(), make_specs(args)
        url = f"{serve.url}/v1/completions"
        scraper = asyncio.create_task(scrape_loop(http, serve, ledger))
        kills = asyncio.create_task(chaos(http, serve, ledger, progress, args))
        start = time.perf_counter()
        outcomes = await run_load(http, url, specs, args, progress)
        duration = time.perf_counter() - start
        events = await kills
        probes = [await bounded(http, url, s, args) for s in probe_specs(args)]
        workers = await workers_of(http, serve.url)
        settled = await settle(http, workers, args.settle_timeout, serve.token.headers())
        scraper.cancel()
        await ledger.scrape_all(workers)
        await ledger.scrape_router(serve.url)
    return Run(outcomes, duration, events, probes, settled, workers), ledger


def summarize(args: argparse.Namespace, serve: Serve, run: Run, ledger: Ledger) -> dict:
    outcomes = run.outcomes
    counts = collections.Counter(o.kind for o in outcomes)
    errors = collections.Counter(o.detail for o in outcomes if o.kind.startswith("error"))
    unclear = collections.Counter(o.detail for o in outcomes if o.kind in ("unclear", "hung"))
    for event in run.kills:
        event["served_since_restart"] = ledger.served_since_restart(event)
    done = [o.e2e for o in outcomes if o.kind == "completed"]
    return {
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "serve": " ".join(serve.cmd[2:]),
        "machine": describe_host(),
        "requests": len(outcomes),
        "mix": {
            "streamed": sum(o.stream for o in outcomes),
            "n2": sum(o.n == 2 for o in outcomes),
            "leaving": sum(s.leave_after is not None for s in make_specs(args)),
        },
        "duration_s": round(run.duration, 1),
        "outcomes": {k: counts.get(k, 0) for k in OUTCOMES},
        "errors": dict(errors.most_common()),
        "unclear": dict(unclear.most_common(10)),
        "completed_e2e_ms": {k: round(v * 1000) for k, v in percentiles(done).items()},
        "kills": run.kills,
        "probes": dict(collections.Counter(o.kind for o in run.probes)),
        "census": run.census,
        **metric_figures(ledger, run.workers, serve.url),
        "supervisor": serve.restart_lines(),
    }


def metric_figures(ledger: Ledger, workers: list[dict], router_url: str) -> dict:
    """The failure metrics, summed over every process that lived."""
    decode = {w["url"] for w in workers if w["role"] == "decode"}
    nodes = {w["url"] for w in workers}
    router = {router_url}
    t = ledger.totals
    return {
        "prefill_fallbacks": t("tandem_prefill_fallbacks_total", "reason", decode),
        "disagg_decisions": t("tandem_disagg_decisions_total", "decision", decode),
        "transfer_failures": t("tandem_kv_transfer_failures_total", "reason", nodes),
        "router_retries": t("tandem_router_retries_total", "reason", router),
        "router_failures": t("tandem_router_request_failures_total", "reason,via", router),
        "router_statuses": t(
            "tandem_router_requests_total", "status", router, handler="/v1/completions"
        ),
        "router_worker_restarts": t("tandem_router_worker_restarts_total", "worker_role", router),
        "router_in_flight": t("tandem_router_requests_in_flight", "role", router),
    }


def report(s: dict) -> str:
    o = s["outcomes"]
    lines = [
        f"command: {s['command']}",
        f"machine: {s['machine']}",
        f"serve:   {s['serve']}",
        f"requests {s['requests']} in {s['duration_s']} s (streamed {s['mix']['streamed']}, "
        f"n=2 {s['mix']['n2']}, leaving mid-stream {s['mix']['leaving']})",
        f"  completed {o['completed']}, disconnected by the client {o['disconnected']}, "
        f"failed with a clear error {o['error_status'] + o['error_event']} "
        f"(status {o['error_status']}, SSE error event {o['error_event']}), "
        f"unclear {o['unclear']}, hung {o['hung']}",
        f"  errors: {s['errors']}",
        f"  unclear or hung: {s['unclear']}",
        f"  completed e2e ms: {s['completed_e2e_ms']}",
    ]
    for k in s["kills"]:
        lines.append(
            f"kill -9 {k['role']} {k['url']} (pid {k['pid']}) after {k['after_requests']} "
            f"requests (router's in flight there: {k['load_at_kill']['inflight']}): "
            f"restarted {k['restarted']}, healthy again after "
            f"{k['seconds_to_healthy']} s, served since: {k['served_since_restart']:g} tokens"
        )
    c = s["census"]
    lines.append(f"probes after the load: {s['probes']}")
    lines.append(f"censuses balanced: {c['balanced']} (after {c['seconds']} s)")
    for url, n in c["nodes"].items():
        fields = ("free", "cached", "in_use", "held", "requests", "total")
        lines.append(f"  {n['role']:<8}{url}  " + ", ".join(f"{f} {n.get(f)}" for f in fields))
    for key in ("prefill_fallbacks", "disagg_decisions", "transfer_failures", "router_retries",
                "router_failures", "router_statuses", "router_worker_restarts",
                "router_in_flight"):  # fmt: skip
        lines.append(f"{key}: {s[key]}")
    lines += ["supervisor:", *(f"  {line}" for line in s["supervisor"])]
    lines.append(f"SIGTERM to tandem serve: {s['sigterm']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    log = Path(args.log or tempfile.mkstemp(prefix="soak-serve-", suffix=".log")[1])
    serve = Serve(args, log)
    serve.start()
    try:
        run, ledger = asyncio.run(soak(args, serve))
    finally:
        stopped = serve.stop()
    summary = summarize(args, serve, run, ledger) | {"sigterm": stopped, "log": str(log)}
    print(report(summary))
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
