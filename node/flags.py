"""The command-line flags every node takes (the model, the engine's limits, where it listens)
and what they become: the process's logging and threads, and the engine's `EngineArgs`."""

from __future__ import annotations

import argparse
import os

import torch

from tandem.engine.api.tier_flags import add_tier_arguments
from tandem.engine.core.config import DTYPE_CHOICES, DTYPE_HELP
from tandem.engine.engine_args import EngineArgs
from tandem.engine.telemetry.request_log import configure_logging
from tandem.engine.telemetry.tracing import add_tracing_argument
from tandem.node.heartbeat import STALL_AFTER_S


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags every node takes: the model, where it listens, the engine's limits, and how the
    process runs."""
    parser.add_argument("--model", required=True, help="model folder (config.json, weights)")
    parser.add_argument("--served-model-name", default=None, help="model label (default: folder)")
    _add_listen_arguments(parser)
    _add_limit_arguments(parser)
    _add_process_arguments(parser)


def _add_listen_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind")
    parser.add_argument(
        "--http-port", type=int, required=True,
        help="the control API (the router's /generate, /abort, /health, /kv/snapshot)",
    )  # fmt: skip
    parser.add_argument(
        "--metrics-port", type=int, default=0,
        help="/metrics, /health and /health/live only, for probes and scrapers (0: any free "
        "port, logged and reported by /health as metrics_port)",
    )  # fmt: skip
    parser.add_argument("--zmq-port", type=int, required=True)


def _add_limit_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES, help=DTYPE_HELP)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--num-kv-blocks", type=int, default=None)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--no-prefix-caching", action="store_true")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument(
        "--kernels",
        choices=("auto", "torch", "triton"),
        default="auto",
        help="compute kernels (default: Triton on CUDA, torch references on the CPU)",
    )
    parser.add_argument(
        "--enforce-eager", action="store_true", help="no CUDA graphs for decode steps"
    )
    parser.add_argument(
        "--kv-hugepages",
        action="store_true",
        default=os.environ.get("TANDEM_KV_HUGEPAGES", "0") not in ("", "0"),
        help="a CPU KV pool on reserved huge pages (sysctl vm.nr_hugepages; in Kubernetes a "
        "hugepages-2Mi limit): NIXL pins one page per 2 MiB instead of 512 "
        "(default: $TANDEM_KV_HUGEPAGES)",
    )
    add_tier_arguments(parser)
    parser.add_argument(
        "--revision",
        default=os.environ.get("TANDEM_REVISION", ""),
        help="model revision label; routers pair prefill and decode only within one "
        "(default: $TANDEM_REVISION)",
    )
    parser.add_argument(
        "--tensor-parallel-size", type=int, default=1,
        help="ranks (processes; one GPU each on a GPU) splitting the model",
    )  # fmt: skip


def _add_process_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument(
        "--engine-stall-timeout",
        type=float,
        default=STALL_AFTER_S,
        help="seconds without a turn of the engine loop before /health and /health/live "
        f"answer 503 'engine stalled' (default: {STALL_AFTER_S:g}; more than the longest "
        "step, a long prefill on the CPU)",
    )
    parser.add_argument(
        "--debug-endpoints",
        action="store_true",
        help="serve /debug/kv, /debug/steps and /debug/blocks (for tests and benchmarks: "
        "they expose raw KV bytes and run checks on the engine thread; off: 404)",
    )
    parser.add_argument("--log-level", default="info")
    add_tracing_argument(parser)


def configure_process(args: argparse.Namespace) -> None:
    """Logging and torch threads for a node process, from its flags."""
    configure_logging(args.log_level)
    if args.threads:
        torch.set_num_threads(args.threads)


def engine_args_from(args: argparse.Namespace) -> EngineArgs:
    return EngineArgs(
        model=args.model,
        dtype=args.dtype,
        device=args.device,
        block_size=args.block_size,
        num_kv_blocks=args.num_kv_blocks,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        enable_prefix_caching=not args.no_prefix_caching,
        gpu_memory_utilization=args.gpu_memory_utilization,
        kernels=args.kernels,
        enforce_eager=args.enforce_eager,
        kv_hugepages=args.kv_hugepages,
        tensor_parallel_size=args.tensor_parallel_size,
        peer_tensor_parallel_sizes=tuple(getattr(args, "peer_tensor_parallel_sizes", ())),
        kv_host_gib=args.kv_host_gib,
        kv_disk_gib=args.kv_disk_gib,
        kv_disk_dir=args.kv_disk_dir,
    )
