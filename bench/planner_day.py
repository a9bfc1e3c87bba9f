"""A simulated day of the SLO planner (issue 43): goodput, SLO attainment and GPU-hours of
the planner against static provisioning for the peak and against the HPA path.

Llama-3-8B on the H100 profile, prefill and decode pools of TP 1 (remote prefill for every
prompt), the router's kv-aware policy. The day's rate follows `Diurnal` (a cosine between
`--trough` and `--peak` req/s, highest at 14:30); each hour is a `--window-s` sample at its
rate (Poisson arrivals, lengths drawn from the Azure conversation trace, `diurnal.py`),
after `--warmup-s` at that rate served but not counted (`day_hour.py`), and its layout
counts for the whole hour (GPU-hours). Every policy serves the same windows:

1. static: the cheapest layout that meets the SLOs on the peak hour's window (the
   planner's own `LayoutSearch`), all day;
2. the planner: at each hour's start, `Planner.decide` on the previous hour's window as the
   routers measured it (its requests, and the latencies its own layout gave them);
3. the HPA path (operator/scaling.py's targets) on the previous hour's time means per pod.

The planner and the HPA start from each pool's minimum in the hour before the first (run,
not counted). Attainment: the share of all the day's requests (each hour weighing its
rate) within both targets; goodput: those requests per second, over the day.

    python -P bench/planner_day.py [--trace CSV] [--trough 30] [--peak 105] [--window-s 45]
        [--warmup-s 15] [--first-hour 0] [--hours 24] [--max-prefill 8] [--max-decode 8]
        [--slo-ttft 2] [--slo-tpot 0.1] [--attainment 0.9] [--planner-requests 200] [--seed 0]
        [--smoke]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from day_hour import HourRun, serve_window
from day_policies import Hpa, Planned, Policy, Static
from day_report import print_decisions, print_hours, print_totals
from diurnal import Diurnal, TraceLengths, hour_window
from machine import describe_host

from tandem.planner.layout_search import Bounds, Layout, LayoutSearch
from tandem.planner.planner import Planner, PlannerSettings
from tandem.sim.cluster import ClusterConfig
from tandem.sim.plan import materialized
from tandem.sim.profiles import load_profile
from tandem.sim.results import SLO
from tandem.sim.shapes import SHAPES
from tandem.sim.workload import SimRequest

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure_llm_2023_conv.csv"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=str(TRACE))
    parser.add_argument("--trough", type=float, default=30.0, help="req/s at 02:30")
    parser.add_argument("--peak", type=float, default=105.0, help="req/s at 14:30")
    parser.add_argument("--window-s", type=float, default=45.0, help="counted per hour")
    parser.add_argument("--warmup-s", type=float, default=15.0, help="before each window")
    parser.add_argument("--first-hour", type=int, default=0)
    parser.add_argument("--hours", type=int, default=24)
    parser.add_argument("--max-prefill", type=int, default=8)
    parser.add_argument("--max-decode", type=int, default=8)
    parser.add_argument("--slo-ttft", type=float, default=2.0)
    parser.add_argument("--slo-tpot", type=float, default=0.1)
    parser.add_argument("--attainment", type=float, default=0.9)
    parser.add_argument("--planner-requests", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (tests)")
    args = parser.parse_args()
    if args.smoke:
        args.trough, args.peak, args.window_s, args.warmup_s = 2.0, 4.0, 5.0, 2.0
        args.first_hour, args.hours = 13, 3
        args.max_prefill, args.max_decode, args.planner_requests = 1, 2, 30
    return args


class Day:
    """The hours simulated, the deployment, and one hour's window served by a layout."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.shape, self.profile = SHAPES["llama-3-8b"], load_profile("h100")
        self.base = ClusterConfig(max_model_len=self.shape.max_position_embeddings)
        self.slo, self.attainment = SLO(args.slo_ttft, args.slo_tpot), args.attainment
        self.curve = Diurnal(args.trough, args.peak)
        self.lengths = TraceLengths.read(args.trace)
        self.window_s, self.warmup_s, self.seed = args.window_s, args.warmup_s, args.seed
        self.hours = list(range(args.first_hour, args.first_hour + args.hours))
        self.prefill, self.decode = Bounds(1, args.max_prefill), Bounds(1, args.max_decode)

    def window(self, hour: int) -> list[SimRequest]:
        """The hour's sample, its prompts drawn once for every policy that serves it."""
        rate = self.curve.hour_rate(hour)
        seed = self.seed * 1000 + hour + 1  # the warm-up hour before the first too
        seconds = self.warmup_s + self.window_s
        return materialized(hour_window(self.lengths, rate, seconds, self.shape.vocab_size, seed))

    def devices(self, layout: Layout) -> int:
        return layout.prefill * self.base.tp_prefill + layout.decode * self.base.tp_decode

    def serve(self, hour: int, layout: Layout, requests: Sequence[SimRequest]) -> HourRun:
        config = replace(self.base, num_prefill=layout.prefill, num_decode=layout.decode)
        run = serve_window(config, self.shape, self.profile, requests, self.slo, self.warmup_s)
        rate = self.curve.hour_rate(hour)
        return HourRun(hour % 24, rate, layout, self.devices(layout), run.records, run.summary,
                       run.pools)  # fmt: skip

    def peak_layout(self) -> Layout:
        """The cheapest layout meeting the SLOs on the busiest hour's window, warm-up
        included (each pool's maximum when none does)."""
        peak = max(self.hours, key=self.curve.hour_rate)
        search = LayoutSearch(self.base, self.shape, self.profile, self.window(peak), self.slo,
                              self.attainment)  # fmt: skip
        best = search.cheapest(self.prefill, self.decode)
        return best.layout if best else Layout(self.prefill.max_replicas, self.decode.max_replicas)


def policies(day: Day, static: Layout, args: argparse.Namespace) -> list[Policy]:
    minimum = Layout(day.prefill.min_replicas, day.decode.min_replicas)
    settings = PlannerSettings(
        day.slo, day.attainment, day.prefill, day.decode, day.base, day.shape, day.profile,
        num_requests=args.planner_requests, seed=args.seed,
    )  # fmt: skip
    return [
        Static("static for the peak", static),
        Planned(Planner(settings), minimum, day.window_s, day.base.block_size),
        Hpa(day.prefill, day.decode, minimum),
    ]


def run_day(day: Day, chosen: Sequence[Policy]) -> dict[str, list[HourRun]]:
    """Every policy through the day, hour by hour (each hour's window drawn once)."""
    runs: dict[str, list[HourRun]] = {p.name: [] for p in chosen}
    previous: dict[str, HourRun | None] = {p.name: None for p in chosen}
    warmup = day.hours[0] - 1
    if any(p.start is not None for p in chosen):
        requests = day.window(warmup)
        for p in chosen:
            if p.start is not None:
                previous[p.name] = day.serve(warmup, p.start, requests)
    for hour in day.hours:
        requests = day.window(hour)
        for p in chosen:
            last = previous[p.name]
            run = day.serve(hour, p.layout_for(hour, last), requests)
            if last is not None:
                last.records = []  # read by this hour's decision only
            runs[p.name].append(run)
            previous[p.name] = run
        done = ", ".join(f"{p.name} {runs[p.name][-1].attainment:.0%}" for p in chosen)
        print(f"hour {hour}: {len(requests)} requests; {done}", file=sys.stderr, flush=True)
    return runs


def main() -> None:
    args = parse_args()
    print("command: python -P " + " ".join(sys.argv))
    print(f"machine: {describe_host()}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    day = Day(args)
    c, p, d = day.curve, day.prefill, day.decode
    print(f"day: {c.trough_rps:g}-{c.peak_rps:g} req/s (cosine, peak at {c.peak_hour:g} h), "
          f"hours {day.hours[0]}-{day.hours[-1]}, a {day.window_s:g} s window each after "
          f"{day.warmup_s:g} s of warm-up; SLO TTFT "
          f"{day.slo.ttft_s:g} s, TPOT {day.slo.tpot_s * 1000:g} ms, {day.attainment:.0%}; "
          f"prefill {p.min_replicas}-{p.max_replicas}, decode {d.min_replicas}-"
          f"{d.max_replicas} replicas of TP 1")  # fmt: skip
    started = time.perf_counter()
    static = day.peak_layout()
    print(f"static for the peak: {static.prefill}P+{static.decode}D "
          f"(search {time.perf_counter() - started:.0f} s)", flush=True)  # fmt: skip
    chosen = policies(day, static, args)
    started = time.perf_counter()
    runs = run_day(day, chosen)
    print(f"day simulated in {time.perf_counter() - started:.0f} s")
    for name, hours in runs.items():
        print_hours(name, hours)
    print_decisions(next(p for p in chosen if isinstance(p, Planned)).decisions)
    print_totals(runs)


if __name__ == "__main__":
    main()
