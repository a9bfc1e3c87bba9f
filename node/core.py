"""What a prefill or decode node's engine thread owns: the model, the KV cache and its
manager, the scheduler, the NIXL agent, the tokenizer and compiled grammars, and the
metrics; plus the command-line flags they
share and the debug views the tests read (block census, raw blocks by hash)."""

from __future__ import annotations

import argparse
import functools
import os
import socket
from dataclasses import dataclass

import torch
from prometheus_client import CollectorRegistry

from tandem.engine.api.kv_events import Load, load_of
from tandem.engine.api.wire import PROTOCOL_VERSION, Fingerprint
from tandem.engine.core.config import EngineConfig
from tandem.engine.core.kv_cache_manager import KVCacheManager
from tandem.engine.core.scheduler import ModelRunnerOutput, Scheduler, SchedulerOutput
from tandem.engine.llm_engine import EngineArgs, grammar_compiler
from tandem.engine.model_runner import ModelRunner
from tandem.engine.parallel.rank_processes import exit_process
from tandem.engine.telemetry.metrics import NodeMetrics
from tandem.engine.telemetry.request_log import configure_logging
from tandem.engine.telemetry.step_log import StepLog, StepWork, context_lens
from tandem.engine.telemetry.tracing import add_tracing_argument
from tandem.engine.tokenizer import load_tokenizer
from tandem.node.heartbeat import STALL_AFTER_S
from tandem.node.kv_agent import NodeAgent


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags every node takes: the model, the engine's limits, and where it listens."""
    parser.add_argument("--model", required=True, help="model folder (config.json, weights)")
    parser.add_argument("--served-model-name", default=None, help="model label (default: folder)")
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
    parser.add_argument("--dtype", default="auto")
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
    )


@dataclass(frozen=True)
class NodeIdentity:
    """Labels and names: `model` and `role` label metrics; `pod` is the host (the pod name
    in Kubernetes); `revision` is what routers pair prefill and decode nodes by."""

    model: str
    role: str
    pod: str
    revision: str = ""

    @classmethod
    def of(cls, args: argparse.Namespace, role: str) -> NodeIdentity:
        model = args.served_model_name or os.path.basename(os.path.normpath(args.model))
        pod = os.environ.get("POD_NAME") or f"{socket.gethostname()}:{args.http_port}"
        return cls(model, role, pod, args.revision)


class NodeCore:
    """Builds the engine parts; lives on the engine thread."""

    def __init__(
        self,
        config: EngineConfig,
        identity: NodeIdentity,
        registry: CollectorRegistry,
        remote_prefill_threshold: int = 0,
        record_events: bool = False,
    ) -> None:
        self.config = config
        self.identity = identity
        self.kv = KVCacheManager(
            config.cache.block_size,
            config.cache.num_blocks,
            config.cache.enable_prefix_caching,
            revision=identity.revision,
            record_events=record_events,
        )
        self.scheduler = Scheduler(config.scheduler, self.kv, remote_prefill_threshold)
        self.runner = ModelRunner(config)
        if self.runner.workers is not None:
            self.runner.workers.watch(exit_process)  # a rank gone: the node is gone
        prefix = f"{identity.role}-{identity.pod}".replace(":", "-")
        self.agent = NodeAgent.create(prefix, self.runner)
        self.tokenizer = load_tokenizer(config.model_dir)
        # Structured outputs arrive as plain data; each node compiles (and caches) its own.
        self.grammars = grammar_compiler(config, self.tokenizer)
        self.grammars.prepare()
        self.metrics = NodeMetrics(registry, identity.model, identity.role, identity.pod)
        self.steps = StepLog()

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        """Run one scheduled step on the model (which receives only `out.plan`), logged and
        counted."""
        work = StepWork.of(out.num_scheduled_tokens, context_lens(out))
        clocks = self.steps.begin()
        result = self.runner.execute(out.plan)
        sampled = sum(1 for t in result.sampled_token_ids if t is not None)
        self.steps.end(clocks, work, sampled)
        self.metrics.observe_step(out)
        return result

    def close(self) -> None:
        """Stop the other tensor-parallel ranks (their watcher first, so that a rank
        stopping is not taken for one dying)."""
        self.runner.close()

    def load(self) -> Load:
        return load_of(self.scheduler)

    @functools.cached_property
    def fingerprint(self) -> Fingerprint:
        """What a peer exchanging KV blocks with this node must share with it (fixed for
        the node's life: /health reports it at every check)."""
        model = self.config.model
        return Fingerprint(
            PROTOCOL_VERSION,
            self.identity.model,
            self.identity.revision,
            str(self.config.dtype).removeprefix("torch."),
            self.config.cache.block_size,
            f"{model.num_layers}x2x{model.num_kv_heads}x{model.head_dim}",
        )

    def kv_report(self) -> dict[str, object]:
        """Check every KV invariant (AssertionError if one fails) and return the census."""
        counts = self.kv.check_integrity()
        return {
            "agent": self.agent.name,
            "free": counts.free,
            "cached": counts.cached,
            "in_use": counts.in_use,
            "total": counts.total,
            "held": self.kv.num_held_blocks,
            "holds": self.kv.hold_keys(),
            "requests": self.scheduler.num_unfinished,
            "rank_writes_in_flight": self.agent.census(),
            "rank_pids": self.runner.workers.pids if self.runner.workers else [],
        }

    def blocks_by_hash(self, hashes: list[int]) -> dict[int, bytes]:
        """Raw bytes of the cached blocks with these hashes (missing ones left out)."""
        found = {}
        for block_hash in hashes:
            block = self.kv.pool.get_cached_block(block_hash)
            if block is not None:
                data = self.runner.kv_cache[block.block_id].contiguous().cpu()
                found[block_hash] = data.view(-1).view(torch.uint8).numpy().tobytes()
        return found
