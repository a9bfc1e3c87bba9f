"""The tables `planner_day.py` prints: each policy's hours, the planner's decisions, and the
day's totals per policy."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from day_hour import HourRun

from tandem.planner.layout_search import Layout
from tandem.planner.planner import Decision


def print_hours(name: str, runs: Sequence[HourRun]) -> None:
    print(f"\n{name}:\n")
    print("| hour | rate req/s | layout | GPUs | attainment | goodput req/s | TTFT p90 s "
          "| TPOT p90 ms |")  # fmt: skip
    print("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in runs:
        ttft, tpot = r.summary["ttft_s"]["p90"], r.summary["tpot_s"]["p90"]
        print(f"| {r.hour:02d}:00 | {r.rate_rps:.1f} | {_layout(r.layout)} | {r.devices} | "
              f"{r.attainment:.1%} | {r.goodput_rps:.1f} | {_num(ttft, 1, 2)} | "
              f"{_num(tpot, 1000, 1)} |")  # fmt: skip


def print_decisions(decisions: Mapping[int, Decision]) -> None:
    """The planner's decision at each hour's start, on the previous hour's window."""
    print("\nplanner decisions (on the previous hour):\n")
    print("| hour | measured | current, simulated | planned | predicted | set | simulations "
          "| s |")  # fmt: skip
    print("| ---: | ---: | ---: | --- | ---: | --- | ---: | ---: |")
    for hour, d in decisions.items():
        print(f"| {hour:02d}:00 | {_share(d.measured_attainment)} | "
              f"{_share(d.current_attainment)} | {_layout(d.planned)} | "
              f"{_share(d.predicted_attainment)} | {_layout(d.target)} | {d.simulations} | "
              f"{d.search_s:.1f} |")  # fmt: skip
    if decisions:
        seconds = [d.search_s for d in decisions.values()]
        print(f"\n{len(seconds)} decisions, {sum(seconds) / len(seconds):.2f} s on average, "
              f"{max(seconds):.2f} s at most")  # fmt: skip


def print_totals(runs: Mapping[str, Sequence[HourRun]]) -> None:
    """Attainment: of every request of the day (each hour weighs its rate); goodput: those
    within the SLOs per second, over the day; GPU-hours: each hour's devices for the hour."""
    print("\n| policy | SLO attainment | goodput req/s | GPU-hours | layouts |")
    print("| --- | ---: | ---: | ---: | --- |")
    for name, hours in runs.items():
        offered = sum(r.rate_rps for r in hours)
        good = sum(r.goodput_rps for r in hours)
        gpu_hours = sum(r.devices for r in hours)
        sizes = sorted({r.devices for r in hours})
        span = f"{sizes[0]}-{sizes[-1]} GPUs" if len(sizes) > 1 else f"{sizes[0]} GPUs"
        print(f"| {name} | {good / offered:.1%} | {good / len(hours):.1f} | {gpu_hours} | "
              f"{span} |")  # fmt: skip


def _layout(layout: Layout) -> str:
    return f"{layout.prefill}P+{layout.decode}D"


def _share(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _num(x: float | None, scale: float, digits: int) -> str:
    return "-" if x is None else f"{x * scale:.{digits}f}"
