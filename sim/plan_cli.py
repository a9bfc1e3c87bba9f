"""`tandem plan`: the cheapest deployment that meets TTFT and TPOT targets at a request
rate, searched with the simulator; prints its predicted figures and an `LLMDeployment`."""

from __future__ import annotations

import argparse
import dataclasses
import time

from tandem.sim.args import (
    add_common_arguments,
    add_tier_arguments,
    model_and_device,
    slo,
    tier_blocks,
    workload,
)
from tandem.sim.cluster import ClusterConfig
from tandem.sim.plan import SearchSpace, deployment_yaml, describe, search
from tandem.sim.plan_pool import default_jobs
from tandem.sim.workload import scale_load


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers: {text!r}") from exc
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected non-negative integers: {text!r}")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    parser.set_defaults(num_requests=300)
    p = parser.add_argument_group("plan")
    p.add_argument("--target-rate", type=float, required=True, help="requests/s to serve")
    p.add_argument("--tp", type=_ints, default=(1, 2, 4, 8), help="TP sizes to try (both pools)")
    p.add_argument("--tp-prefill", type=_ints, default=None, help="prefill TP sizes (default --tp)")
    p.add_argument("--tp-decode", type=_ints, default=None, help="decode TP sizes (default --tp)")
    p.add_argument("--thresholds", type=_ints, default=(0, 512, 2048), help="remote thresholds")
    p.add_argument("--max-devices", type=int, default=16)
    p.add_argument("--attainment", type=float, default=0.9, help="share meeting both SLOs")
    p.add_argument("--policy", default="kv-aware")
    p.add_argument("--max-model-len", type=int, default=None, help="default: the model's")
    p.add_argument("--yaml", default=None, help="write the LLMDeployment here too")
    p.add_argument(
        "--jobs", type=int, default=default_jobs(), help="candidates simulated at once (CPUs)"
    )
    add_tier_arguments(parser)


def run(args: argparse.Namespace) -> None:
    shape, profile = model_and_device(args)
    if args.target_rate <= 0 or not 0 < args.attainment <= 1 or args.max_devices < 1:
        raise SystemExit("error: need --target-rate > 0, 0 < --attainment <= 1, --max-devices >= 1")
    if args.jobs < 1:
        raise SystemExit("error: need --jobs >= 1")
    requests = workload(args, shape.vocab_size)
    span = max(r.arrival_s for r in requests) - min(r.arrival_s for r in requests)
    if span > 0:  # replay the workload at the target rate
        requests = scale_load(requests, args.target_rate * span / len(requests))
    base = ClusterConfig(
        policy=args.policy, max_model_len=args.max_model_len or shape.max_position_embeddings
    )
    space = SearchSpace(
        args.tp, args.thresholds, args.max_devices, args.attainment, args.tp_prefill, args.tp_decode
    )
    host, disk = tier_blocks(args, shape, profile, base.block_size)
    if host:
        base = dataclasses.replace(base, kv_host_blocks=host, kv_disk_blocks=disk)
        space = _tp1(space)
    elif disk:
        raise SystemExit("error: a disk KV tier sits under a host tier: give --kv-host-gib too")
    started = time.perf_counter()
    best, tried = search(base, shape, profile, requests, slo(args), space, jobs=args.jobs)
    print(f"searched {len(tried)} candidates in {time.perf_counter() - started:.1f} s")
    if best is None:
        raise SystemExit(
            f"no deployment of up to {args.max_devices} {profile.name} devices meets the SLOs "
            f"({len(tried)} simulated); raise --max-devices or relax the targets"
        )
    print(f"\ncheapest: {describe(best)}")
    text = deployment_yaml(best, shape.name, args.policy, (args.kv_host_gib, args.kv_disk_gib))
    print(text)
    if args.yaml:
        with open(args.yaml, "w") as f:
            f.write(text)


def _tp1(space: SearchSpace) -> SearchSpace:
    """With KV tiers the engine serves TP 1 only: the search narrowed to it."""
    if 1 not in space.prefill_sizes or 1 not in space.decode_sizes:
        raise SystemExit("error: KV tiers need TP 1 (as the engine): let --tp include 1")
    if {*space.prefill_sizes, *space.decode_sizes} != {1}:
        print("KV tiers need TP 1 for now (as the engine): searching TP 1 only")
    return dataclasses.replace(space, tp_sizes=(1,), tp_prefill=None, tp_decode=None)
