"""Disaggregated against aggregated at equal device count, in the simulator: for each trace
and model, every prefill:decode split of the devices (0 prefill nodes: aggregated) and
remote-prefill threshold, replayed at rising loads; the goodput of a configuration is, as
DistServe defines it, the highest offered request rate at which at least 90% of requests
meet both SLOs (the sweep stops at the first load that misses).

    python -P bench/sim_disagg.py --num-requests 1000
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe_host

from tandem.sim.cluster import ClusterConfig
from tandem.sim.profiles import load_profile
from tandem.sim.results import SLO
from tandem.sim.shapes import load_shape
from tandem.sim.simulate import simulate
from tandem.sim.traces import read_trace
from tandem.sim.workload import scale_load

TRACES = "/work/shared/traces/azure_llm_2023_conv.csv,/work/shared/traces/azure_llm_2023_code.csv"
# model:TP:load factors
MODELS = "llama-3-8b:1:4,8,16,24,32,48,64,96;llama-3-70b:4:1,2,3,4,6,8,12,16"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--traces", default=TRACES)
    p.add_argument("--models", default=MODELS, help="model:TP:load factors, ';'-separated")
    p.add_argument("--device", default="h100")
    p.add_argument("--devices", type=int, default=8)
    p.add_argument("--num-requests", type=int, default=1000)
    p.add_argument("--thresholds", default="0,512")
    p.add_argument(
        "--all-splits", action="store_true", help="every split (default: up to half prefill)"
    )
    p.add_argument("--slo-ttft", type=float, default=1.0)
    p.add_argument("--slo-tpot", type=float, default=0.05)
    p.add_argument("--attainment", type=float, default=0.9)
    args = p.parse_args()
    profile, slo = load_profile(args.device), SLO(args.slo_ttft, args.slo_tpot)
    thresholds = [int(t) for t in args.thresholds.split(",")]
    print(f"command: python -P bench/sim_disagg.py {' '.join(sys.argv[1:])}")
    print(f"machine: {describe_host()}")
    print("| trace | model | layout | threshold | goodput req/s | at load x | TTFT p90 s "
          "| TPOT p90 ms |")  # fmt: skip
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    start = time.perf_counter()
    for trace_path in args.traces.split(","):
        for spec in args.models.split(";"):
            name, tp, loads = spec.split(":")
            shape, tp = load_shape(name), int(tp)
            trace = read_trace(trace_path, shape.vocab_size, args.num_requests)
            nodes = args.devices // tp
            for num_prefill in range(nodes if args.all_splits else nodes // 2 + 1):
                for threshold in thresholds if num_prefill else [0]:
                    config = ClusterConfig(
                        num_prefill=num_prefill, num_decode=nodes - num_prefill,
                        tp_prefill=tp, tp_decode=tp, remote_prefill_threshold=threshold,
                    )  # fmt: skip
                    best = _best(config, shape, profile, trace, slo, loads, args.attainment)
                    _row(Path(trace_path).stem, name, config, best)
    print(f"simulated in {time.perf_counter() - start:.0f} s")


def _best(config, shape, profile, trace, slo, loads: str, attainment: float):
    """(load, offered req/s, summary) of the highest load meeting the attainment."""
    span = trace[-1].arrival_s - trace[0].arrival_s
    best = None
    for factor in (float(x) for x in loads.split(",")):
        s = simulate(config, shape, profile, scale_load(trace, factor), slo)
        if s["num_finished"] < s["num_requests"] or s["slo"]["attained"] < attainment:
            break
        best = (factor, len(trace) * factor / span, s)
    return best


def _row(trace: str, model: str, c: ClusterConfig, best) -> None:
    layout = f"{c.num_prefill}P+{c.num_decode}D" if c.num_prefill else f"aggregated {c.num_decode}"
    layout += f" x TP{c.tp_decode}"
    if best is None:
        print(f"| {trace} | {model} | {layout} | {c.remote_prefill_threshold} | none | - | - | - |")
        return
    factor, offered, s = best
    print(
        f"| {trace} | {model} | {layout} | {c.remote_prefill_threshold} | "
        f"{offered:.1f} | {factor:g} | {s['ttft_s']['p90']:.3f} | "
        f"{1e3 * s['tpot_s']['p90']:.1f} |",
        flush=True,
    )


if __name__ == "__main__":
    main()
