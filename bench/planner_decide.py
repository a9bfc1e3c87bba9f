"""How long one SLO-planner decision takes (issue 43), and that its pruned search finds the
layout an exhaustive one over the same bounds finds.

A slice of a trace (the Azure code trace by default) replayed at each `--rates` becomes one
interval of router metrics (a real `RouterMetrics`, its Prometheus text parsed as the
planner parses a router's), then `Planner.decide` runs on it as the planner process does
(Llama-3-8B on the H100 profile; prefill 0..P, decode 1..D, TP 1). Beside it, every layout
of the bounds simulated on the same modelled workload: its time and cheapest answer.

    python -P bench/planner_decide.py [--workload TRACE] [--num-requests 1000]
        [--rates 5 20 40] [--max-prefill 8] [--max-decode 8] [--slo-ttft 1] [--slo-tpot 0.05]
        [--smoke]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from machine import describe_host
from prometheus_client import CollectorRegistry, generate_latest

from tandem.planner.layout_search import Bounds, Layout, LayoutSearch
from tandem.planner.planner import Planner, PlannerSettings
from tandem.planner.traffic import RouterScrape, window
from tandem.planner.workload import observed_workload
from tandem.router.metrics import RouterMetrics
from tandem.router.phase_metrics import ChoiceClock
from tandem.sim.cluster import ClusterConfig
from tandem.sim.profiles import load_profile
from tandem.sim.results import SLO
from tandem.sim.shapes import SHAPES
from tandem.sim.traces import read_trace

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure_llm_2023_code.csv"


def interval_of(requests, seconds: float) -> object:
    """The trace's requests as one interval of a router's metrics (every request finished;
    latencies far past any target: an interval the planner does not learn from)."""
    metrics = RouterMetrics(CollectorRegistry(), "m", "bench")
    before = {"r": RouterScrape.parse(generate_latest(metrics.registry).decode())}
    for r in requests:
        clock = ChoiceClock(start=0.0)
        clock.on_record({"token_ids": [1], "finish_reason": None, "received_at": 60.0})
        usage = {"prompt_tokens": r.num_prompt_tokens, "completion_tokens": r.num_output_tokens}
        clock.on_record({"token_ids": [1], "finish_reason": "stop", "received_at": 120.0,
                         "usage": usage})  # fmt: skip
        metrics.phases.observe(clock)
        metrics.child(metrics.ttft).observe(60.0)
    after = {"r": RouterScrape.parse(generate_latest(metrics.registry).decode())}
    return window(before, after, seconds, 16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default=str(TRACE))
    parser.add_argument("--num-requests", type=int, default=1000)
    parser.add_argument("--rates", type=float, nargs="+", default=[5.0, 20.0, 40.0])
    parser.add_argument("--max-prefill", type=int, default=8)
    parser.add_argument("--max-decode", type=int, default=8)
    parser.add_argument("--slo-ttft", type=float, default=1.0)
    parser.add_argument("--slo-tpot", type=float, default=0.05)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (tests)")
    args = parser.parse_args()
    if args.smoke:
        args.num_requests, args.rates, args.max_prefill, args.max_decode = 100, [20.0], 1, 2
    print("command: python -P " + " ".join(sys.argv))
    print(f"machine: {describe_host()}")
    shape, profile = SHAPES["llama-3-8b"], load_profile("h100")
    requests = read_trace(args.workload, shape.vocab_size, args.num_requests, 1.0, 0)
    prefill, decode = Bounds(0, args.max_prefill), Bounds(1, args.max_decode)
    settings = PlannerSettings(
        SLO(args.slo_ttft, args.slo_tpot), 0.9, prefill, decode,
        ClusterConfig(max_model_len=shape.max_position_embeddings), shape, profile,
        num_requests=40 if args.smoke else 200,
    )  # fmt: skip
    grid = [
        Layout(p, d)
        for p in range(prefill.max_replicas + 1)
        for d in range(1, decode.max_replicas + 1)
    ]
    print("\n| rate req/s | decision s | simulations | plan | exhaustive s | layouts | its plan |")
    print("| ---: | ---: | ---: | --- | ---: | ---: | --- |")
    for rate in args.rates:
        traffic = interval_of(requests, len(requests) / rate)
        decision = Planner(settings).decide(0.0, Layout(1, 1), traffic)
        workload = observed_workload(traffic, settings.num_requests, shape.vocab_size)
        search = LayoutSearch(settings.base, shape, profile, workload, settings.slo, 0.9)
        started = time.perf_counter()
        meeting = [p for p in map(search.predict, grid) if p.meets]
        exhaustive_s = time.perf_counter() - started
        best = min(meeting, key=lambda p: (p.devices, -(p.attained or 0)), default=None)
        theirs = f"{best.layout.prefill}P+{best.layout.decode}D" if best else "none"
        mine = f"{decision.planned.prefill}P+{decision.planned.decode}D"
        print(f"| {rate:g} | {decision.search_s:.2f} | {decision.simulations} | {mine} | "
              f"{exhaustive_s:.1f} | {len(grid)} | {theirs} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
