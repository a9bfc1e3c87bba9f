"""Command-line flags that `tandem simulate` and `tandem plan` share: the model, the device,
the workload, the SLO and the nodes' KV tiers."""

from __future__ import annotations

import argparse

from tandem.sim.profiles import DeviceProfile, load_profile
from tandem.sim.results import SLO
from tandem.sim.shapes import ModelShape, load_shape
from tandem.sim.traces import read_trace
from tandem.sim.transfer_profile import load_transfer_profile
from tandem.sim.workload import SimRequest, scale_load, synthetic


def _pair(text: str) -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in text.split(","))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected MIN,MAX, got {text!r}") from exc
    if not 0 < lo <= hi:
        raise argparse.ArgumentTypeError(f"expected 0 < MIN <= MAX, got {text!r}")
    return lo, hi


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", default="llama-3-8b", help="a model folder or a shipped shape (llama-3-8b, ...)"
    )
    parser.add_argument(
        "--device", default="h100", help="device profile: h100, h200, cpu, or a profile JSON file"
    )
    parser.add_argument(
        "--transfer-profile",
        default=None,
        help="KV-link constants fitted by bench/transfer.py --profile-out (default: the "
        "device profile's)",
    )
    w = parser.add_argument_group("workload")
    w.add_argument(
        "--workload", default="synthetic", help="a trace (.jsonl Mooncake, .csv Azure) or synthetic"
    )
    w.add_argument("--num-requests", type=int, default=1000, help="requests to take or make")
    w.add_argument("--rate", type=float, default=10.0, help="synthetic: requests/s (Poisson)")
    w.add_argument("--prompt-tokens", type=_pair, default=(128, 2048), help="synthetic: MIN,MAX")
    w.add_argument("--output-tokens", type=_pair, default=(32, 512), help="synthetic: MIN,MAX")
    w.add_argument(
        "--shared-prefix", type=int, default=0, help="synthetic: tokens of a common system prompt"
    )
    w.add_argument(
        "--length-scale", type=float, default=1.0, help="trace: divide lengths (and blocks) by it"
    )
    w.add_argument("--time-scale", type=float, default=1.0, help="replay at this times the load")
    w.add_argument(
        "--seed",
        type=int,
        default=0,
        help="the workload's draws and the simulation's (faults, "
        "the steps' spread where the device profile has one)",
    )
    s = parser.add_argument_group("service level objective")
    s.add_argument("--slo-ttft", type=float, default=2.0, help="seconds to the first token")
    s.add_argument("--slo-tpot", type=float, default=0.1, help="seconds per later token")


def add_tier_arguments(parser: argparse.ArgumentParser) -> None:
    """Every node's lower KV tiers, under the nodes' own flag names (docs/kv-tiers.md)."""
    group = parser.add_argument_group("KV tiers (every node)")
    group.add_argument(
        "--kv-host-gib", type=float, default=0.0,
        help="a host-memory KV tier of this many GiB under each node's device pool (0: none)",
    )  # fmt: skip
    group.add_argument(
        "--kv-disk-gib", type=float, default=0.0,
        help="a disk KV tier of this many GiB under each node's host tier (0: none)",
    )  # fmt: skip


def tier_blocks(
    args: argparse.Namespace, shape: ModelShape, profile: DeviceProfile, block_size: int
) -> tuple[int, int]:
    """(host, disk) tier sizes in whole blocks of one rank, as the engine sizes them
    (`EngineArgs`: the GiB given over one block's bytes, rounded down)."""
    block_bytes = shape.kv_block_bytes(profile.dtype_bytes, block_size)
    sizes = []
    for name in ("host", "disk"):
        gib = getattr(args, f"kv_{name}_gib")
        if not 0 <= gib < float("inf"):
            raise SystemExit(f"error: --kv-{name}-gib must be a size in GiB, at least 0")
        blocks = int(gib * 2**30) // block_bytes
        if gib and not blocks:
            raise SystemExit(
                f"error: a {name} KV tier of {gib} GiB holds no block of {block_bytes} bytes"
            )
        sizes.append(blocks)
    return sizes[0], sizes[1]


def model_and_device(args: argparse.Namespace) -> tuple[ModelShape, DeviceProfile]:
    try:
        shape, profile = load_shape(args.model), load_profile(args.device)
        if args.transfer_profile:
            profile = load_transfer_profile(args.transfer_profile).apply(profile)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from exc
    return shape, profile


def workload(args: argparse.Namespace, vocab_size: int) -> list[SimRequest]:
    if args.num_requests < 1:
        raise SystemExit("error: --num-requests must be at least 1")
    try:
        if args.workload == "synthetic":
            requests = synthetic(
                args.num_requests,
                args.rate,
                args.prompt_tokens,
                args.output_tokens,
                vocab_size,
                args.shared_prefix,
                args.seed,
            )
        else:
            requests = read_trace(
                args.workload, vocab_size, args.num_requests, args.length_scale, args.seed
            )
        return scale_load(requests, args.time_scale)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from exc


def slo(args: argparse.Namespace) -> SLO:
    return SLO(args.slo_ttft, args.slo_tpot)
