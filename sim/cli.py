"""`tandem simulate`: a deployment in simulated time on a workload, at one or more loads;
prints the figures, writes them as JSON, and plots latency against load."""

from __future__ import annotations

import argparse
import json

from tandem.sim.args import (
    add_common_arguments,
    add_tier_arguments,
    model_and_device,
    slo,
    tier_blocks,
    workload,
)
from tandem.sim.cluster import ClusterConfig
from tandem.sim.faults import Faults, Outage
from tandem.sim.simulate import sweep


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    d = parser.add_argument_group("deployment")
    d.add_argument("--prefill", type=int, default=1, help="prefill nodes (0: aggregated)")
    d.add_argument("--decode", type=int, default=1, help="decode nodes")
    d.add_argument("--tp-prefill", type=int, default=1)
    d.add_argument("--tp-decode", type=int, default=1)
    d.add_argument("--policy", default="kv-aware", help="router policy")
    d.add_argument("--threshold", type=int, default=0, help="remote-prefill threshold (tokens)")
    d.add_argument("--block-size", type=int, default=16)
    d.add_argument("--num-kv-blocks", type=int, default=None, help="per node (default: fit)")
    d.add_argument("--max-num-batched-tokens", type=int, default=2048)
    d.add_argument("--max-num-seqs", type=int, default=256)
    d.add_argument("--max-model-len", type=int, default=None, help="default: the model's")
    add_tier_arguments(parser)
    f = parser.add_argument_group("failures")
    f.add_argument(
        "--on-prefill-failure", default="recompute", choices=("recompute", "fail"),
        help="decode nodes' policy after a failed remote prefill and its one retry",
    )  # fmt: skip
    f.add_argument("--prefill-timeout", type=float, default=30.0, help="seconds per attempt")
    f.add_argument(
        "--hold-timeout",
        type=float,
        default=120.0,
        help="seconds an abandoned "
        "attempt's blocks stay held without the prefill worker's confirmation",
    )
    f.add_argument("--abort-share", type=float, default=0.0, help="share of clients that cancel")
    f.add_argument("--abort-after", type=float, default=1.0, help="seconds after arrival")
    f.add_argument(
        "--kill-prefill", action="append", default=[], metavar="I@T[+R]",
        help="prefill worker I dies at T simulated seconds (restarting R seconds later)",
    )  # fmt: skip
    f.add_argument(
        "--kill-decode", action="append", default=[], metavar="I@T[+R]",
        help="decode worker I dies at T simulated seconds (restarting R seconds later)",
    )  # fmt: skip
    parser.add_argument(
        "--load-factors", default="1", help="comma-separated load factors to sweep, e.g. 0.5,1,2"
    )
    parser.add_argument("--out", default=None, help="write the result JSON here")
    parser.add_argument("--plot", default=None, help="write the latency-against-load PNG here")


def cluster_config(
    args: argparse.Namespace, max_model_len: int, tiers: tuple[int, int] = (0, 0)
) -> ClusterConfig:
    """The deployment the flags describe; `tiers`: each node's (host, disk) KV tier blocks."""
    try:
        return ClusterConfig(
            num_prefill=args.prefill,
            num_decode=args.decode,
            policy=args.policy,
            remote_prefill_threshold=args.threshold,
            tp_prefill=args.tp_prefill,
            tp_decode=args.tp_decode,
            block_size=args.block_size,
            num_kv_blocks=args.num_kv_blocks,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_num_seqs=args.max_num_seqs,
            max_model_len=args.max_model_len or max_model_len,
            on_prefill_failure=args.on_prefill_failure,
            prefill_timeout_s=args.prefill_timeout,
            hold_timeout_s=args.hold_timeout,
            kv_host_blocks=tiers[0],
            kv_disk_blocks=tiers[1],
        )
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from exc


def faults(args: argparse.Namespace) -> Faults:
    outages = []
    for role in ("prefill", "decode"):
        for text in getattr(args, f"kill_{role}"):
            try:
                outages.append(Outage.parse(text, role))
            except ValueError as exc:
                raise SystemExit(f"error: --kill-{role}: {exc}") from exc
    try:
        return Faults(args.abort_share, args.abort_after, tuple(outages), args.seed)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from exc


def run(args: argparse.Namespace) -> None:
    shape, profile = model_and_device(args)
    tiers = tier_blocks(args, shape, profile, args.block_size)
    config = cluster_config(args, shape.max_position_embeddings, tiers)
    try:
        factors = [float(f) for f in args.load_factors.split(",")]
    except ValueError as exc:
        raise SystemExit(f"error: --load-factors: {exc}") from exc
    requests = workload(args, shape.vocab_size)
    try:
        result = sweep(
            config, shape, profile, requests, slo(args), factors, faults(args), args.seed
        )
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from exc
    for r in result["runs"]:
        print(_line(r))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    if args.plot:
        from tandem.sim.plot import plot_sweep

        plot_sweep(result, args.plot)


def _line(r: dict) -> str:
    pc, pools = r["prefix_cache"], r["pools"]
    return (
        f"load x{r['load_factor']:g} ({r['offered_rps']:.2f} req/s offered): "
        f"{r['num_finished']}/{r['num_requests']} done, {r['throughput_rps']:.2f} req/s, "
        f"goodput {r['goodput_rps']:.2f} req/s; "
        f"TTFT p50 {r['ttft_s']['p50']:.3f} s p90 {r['ttft_s']['p90']:.3f} s; "
        f"TPOT p50 {_ms(r['tpot_s']['p50'])} p90 {_ms(r['tpot_s']['p90'])}; "
        f"reused prompt tokens {100 * (pc['reused_token_share'] or 0):.1f}%; "
        f"KV moved {r['kv_transfer']['bytes'] / 1e9:.2f} GB; "
        f"decode busy {100 * pools['decode']['busy_mean']:.0f}%; "
        f"simulated in {r['wall_s']:.1f} s" + _tier_line(r) + _failure_line(r["failures"])
    )


def _tier_line(r: dict) -> str:
    """The prefix hits by tier and the blocks the tiers moved, with tiers only."""
    t, pc = r["kv_tiers"], r["prefix_cache"]
    if not t["host_blocks"]:
        return ""
    hits, moved = pc["tier_hits"], t["moved"]
    return (
        f"\n  KV tiers ({t['host_blocks']} host, {t['disk_blocks']} disk blocks a node): "
        f"prefix hits {100 * (pc['hit_rate'] or 0):.1f}% of the tokens looked up (device "
        f"{hits['device']}, host {hits['host']}, disk {hits['disk']}); blocks moved host down "
        f"{moved['host']['down']} up {moved['host']['up']}, disk down {moved['disk']['down']} "
        f"up {moved['disk']['up']}"
    )


def _failure_line(f: dict) -> str:
    if not (
        f["aborted"] or f["errors"] or f["fallbacks"] or f["prefill_deaths"] or f["decode_deaths"]
    ):
        return ""
    line = (
        f"\n  failures: {f['aborted']} aborted, "
        f"{f['errors']} failed{_counts(f['errors_by_kind'])}, "
        f"fall-backs {_counts(f['fallbacks'], '')} ({f['recomputed_locally']} recomputed "
        f"locally), {f['prefill_deaths']} prefill deaths, {f['prefill_restarts']} restarts, "
        f"{f['hold_timeouts']} hold timeouts, {f['held_blocks_at_end']} blocks held at the "
        f"end; router retries {_counts(f['router_retries'], '')}"
    )
    if f["decode_deaths"]:
        line += (
            f"\n  decode deaths {f['decode_deaths']}, restarts {f['decode_restarts']}; requests "
            f"hit, by outcome: {_counts(f['decode_death_outcomes'], '')}; KV write failures "
            f"{_counts(f['kv_transfer_failures'], '')}"
        )
    return line


def _counts(counts: dict[str, int], wrap: str = "()") -> str:
    """`{"a": 1, "b": 2}` -> ` (a 1, b 2)`; `wrap` '' gives `a 1, b 2` (or `none`)."""
    text = ", ".join(f"{k} {v}" for k, v in counts.items())
    if not wrap:
        return text or "none"
    return f" ({text})" if text else ""


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1e3 * seconds:.1f} ms"
