"""How long `tandem plan`'s search takes, with each of its shortcuts turned on in turn.

The same search (a trace replayed at a target rate, Llama-3-8B on the H100 profile by
default) runs four ways: exhaustive (every candidate's simulation to the end, the prompts
drawn at each arrival: the search before issue 43), then with the SLO watch stopping
losers, then with the prompts drawn once, then over `--jobs` processes. Each prints its
time and how many candidates it simulated; every way must find the same deployment.

    python -P bench/plan_search.py [--workload TRACE] [--num-requests 300]
        [--target-rate 20] [--slo-ttft 1] [--slo-tpot 0.05] [--max-devices 8] [--jobs N]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from machine import describe_host

from tandem.sim import plan
from tandem.sim.cluster import ClusterConfig
from tandem.sim.plan_pool import default_jobs
from tandem.sim.profiles import load_profile
from tandem.sim.results import SLO
from tandem.sim.shapes import SHAPES
from tandem.sim.simulate import simulate
from tandem.sim.traces import read_trace
from tandem.sim.workload import scale_load

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure_llm_2023_code.csv"


def whole_runs(*args, attainment=None, **kwargs):
    """`simulate` with no SLO watch: every run to its end."""
    return simulate(*args, **kwargs)


def timed_search(args: argparse.Namespace, watch: bool, draw_once: bool, jobs: int):
    shape, profile = SHAPES[args.model], load_profile(args.device)
    requests = read_trace(args.workload, shape.vocab_size, args.num_requests, 1.0, 0)
    span = max(r.arrival_s for r in requests) - min(r.arrival_s for r in requests)
    requests = scale_load(requests, args.target_rate * span / len(requests))
    base = ClusterConfig(max_model_len=shape.max_position_embeddings)
    space = plan.SearchSpace(max_devices=args.max_devices)
    patches = []
    if not watch:
        patches.append(mock.patch.object(plan, "simulate", whole_runs))
    if not draw_once:
        patches.append(mock.patch.object(plan, "materialized", list))
    for p in patches:
        p.start()
    try:
        started = time.perf_counter()
        best, tried = plan.search(
            base, shape, profile, requests, SLO(args.slo_ttft, args.slo_tpot), space,
            log=lambda _: None, jobs=jobs,
        )  # fmt: skip
        return time.perf_counter() - started, best, tried
    finally:
        for p in patches:
            p.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default=str(TRACE))
    parser.add_argument("--model", default="llama-3-8b")
    parser.add_argument("--device", default="h100")
    parser.add_argument("--num-requests", type=int, default=300)
    parser.add_argument("--target-rate", type=float, default=20.0)
    parser.add_argument("--slo-ttft", type=float, default=1.0)
    parser.add_argument("--slo-tpot", type=float, default=0.05)
    parser.add_argument("--max-devices", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=default_jobs())
    args = parser.parse_args()
    print("command: python -P " + " ".join(sys.argv))
    print(f"machine: {describe_host()}")
    ways = [
        ("exhaustive (before)", False, False, 1),
        ("+ SLO watch", True, False, 1),
        ("+ prompts drawn once", True, True, 1),
        (f"+ {args.jobs} processes", True, True, args.jobs),
    ]
    print("\n| search | seconds | candidates | stopped early | plan |")
    print("| --- | ---: | ---: | ---: | --- |")
    answers = set()
    for name, watch, draw_once, jobs in ways:
        seconds, best, tried = timed_search(args, watch, draw_once, jobs)
        stopped = sum(1 for c in tried if c.summary.get("stopped_early"))
        answer = plan.describe(best) if best else "none meets the SLOs"
        answers.add(best.config if best else None)
        print(f"| {name} | {seconds:.1f} | {len(tried)} | {stopped} | {answer} |", flush=True)
    if len(answers) != 1:
        raise SystemExit("the ways disagree on the plan")


if __name__ == "__main__":
    main()
