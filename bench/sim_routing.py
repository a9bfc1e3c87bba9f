"""Routing at scale in the simulator: each policy on N decode workers (aggregated: every
worker prefills its own prompts, so the prefix hits are the routing's), on a trace whose
load is scaled with N so every worker sees the same load.

    python -P bench/sim_routing.py --workers 16,64 --num-requests 4000
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe_host

from tandem.router.policy import POLICIES
from tandem.sim.cluster import ClusterConfig
from tandem.sim.profiles import load_profile
from tandem.sim.results import SLO
from tandem.sim.shapes import load_shape
from tandem.sim.simulate import simulate
from tandem.sim.traces import read_trace
from tandem.sim.workload import scale_load

TRACE = "/work/shared/traces/mooncake_conversation_trace.jsonl"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--trace", default=TRACE)
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument("--device", default="h100")
    p.add_argument("--workers", default="16,64")
    p.add_argument("--num-requests", type=int, default=4000)
    p.add_argument("--load-per-worker", type=float, default=0.25, help="trace load factor / N")
    p.add_argument("--max-model-len", type=int, default=131072)
    p.add_argument("--policies", default=",".join(POLICIES), help="comma-separated")
    args = p.parse_args()
    shape, profile = load_shape(args.model), load_profile(args.device)
    trace = read_trace(args.trace, shape.vocab_size, args.num_requests)
    print(f"command: python -P bench/sim_routing.py {' '.join(sys.argv[1:])}")
    print(f"machine: {describe_host()}")
    print("| decode workers | load factor | policy | prefix hit rate | TTFT p50 s | TTFT p90 s "
          "| TPOT p50 ms | simulated in s |")  # fmt: skip
    print("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for n in (int(w) for w in args.workers.split(",")):
        factor = args.load_per_worker * n
        requests = scale_load(trace, factor)
        for policy in args.policies.split(","):
            config = ClusterConfig(
                num_prefill=0, num_decode=n, policy=policy, max_model_len=args.max_model_len
            )
            start = time.perf_counter()
            s = simulate(config, shape, profile, requests, SLO())
            wall = time.perf_counter() - start
            hit = s["prefix_cache"]["decode_hit_rate"]
            print(
                f"| {n} | {factor:g} | {policy} | {100 * hit:.1f}% | {s['ttft_s']['p50']:.3f} "
                f"| {s['ttft_s']['p90']:.3f} | {1e3 * s['tpot_s']['p50']:.1f} | {wall:.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
