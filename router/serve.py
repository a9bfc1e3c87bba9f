"""`tandem serve`: the router, N prefill and M decode processes on this machine.

The embedded default and the first thing a newcomer runs. Without `--model` it writes the
small random checkpoint once (into the user cache) and serves that. Every request is
disaggregated (remote-prefill threshold 0) so the real path runs: router -> decode node ->
prefill node over ZMQ -> KV blocks over NIXL -> decode. A child that dies is restarted
on the same ports under a bounded policy (`tandem.router.supervisor`); Ctrl-C, SIGINT or
SIGTERM stops every child, and so does a child that crashes too often.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from tandem.engine.api.deployment_token import ENV as TOKEN_ENV
from tandem.engine.api.deployment_token import DeploymentToken
from tandem.engine.api.huge_pages import with_huge_pages
from tandem.engine.api.ports import free_port
from tandem.engine.api.tier_flags import add_tier_arguments
from tandem.engine.telemetry.tracing import add_tracing_argument
from tandem.router.cli import (
    POLICY_NAMES,
    add_kv_tier_costs,
    add_reasoning_parser,
    add_responses_store_size,
    add_tool_call_parser,
)
from tandem.router.supervisor import Child, RestartPolicy, Supervisor


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="model folder (default: a generated one)")
    parser.add_argument("--prefill", type=int, default=1, help="prefill processes")
    parser.add_argument("--decode", type=int, default=1, help="decode processes")
    parser.add_argument("--port", type=int, default=8000, help="the router's port")
    parser.add_argument("--host", default="127.0.0.1", help="the router's address")
    parser.add_argument("--policy", choices=POLICY_NAMES, default="kv-aware")
    add_kv_tier_costs(parser)
    add_tool_call_parser(parser)
    add_reasoning_parser(parser)
    add_responses_store_size(parser)
    parser.add_argument(
        "--remote-prefill-threshold", type=int, default=0, help="0: disaggregate every request"
    )
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--num-kv-blocks", type=int, default=None, help="per node")
    add_tier_arguments(parser)  # per node; each node's disk tier in a folder of its own
    parser.add_argument(
        "--threads", type=int, default=None,
        help="torch threads per node (default: the CPUs this process may run on, shared "
        "evenly by the prefill and decode nodes, at least 1)",
    )  # fmt: skip
    parser.add_argument(
        "--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
        help="the nodes' dtype (auto: the checkpoint's on a GPU; on the CPU bfloat16 where it "
        "has AVX512-BF16 or AMX, else float32)",
    )  # fmt: skip
    for role in ("prefill", "decode"):
        parser.add_argument(
            f"--{role}-tensor-parallel-size", type=int, default=1,
            help=f"ranks per {role} node (processes; one GPU each on a GPU)",
        )  # fmt: skip
    parser.add_argument("--log-level", default="warning", help="children's log level")
    parser.add_argument(
        "--debug-endpoints", action="store_true", help="the nodes' flag of that name"
    )
    add_tracing_argument(parser)
    parser.add_argument("--ready-timeout", type=float, default=300.0, help="seconds")
    parser.add_argument(
        "--prefill-timeout", type=float, default=None, help="decode nodes' flag of that name"
    )
    parser.add_argument(
        "--hold-timeout", type=float, default=None, help="decode nodes' flag of that name"
    )
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=RestartPolicy.max_restarts,
        help="restarts of one child allowed within --restart-window before everything stops "
        "(0: any child dying stops everything)",
    )
    parser.add_argument(
        "--restart-window", type=float, default=RestartPolicy.window_s, help="seconds"
    )


def default_model_dir() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "tandem" / "tiny-llama"


def ensure_model(model: str | None) -> Path:
    """The model folder to serve; the generated checkpoint when none is given."""
    if model is not None:
        return Path(model)
    path = default_model_dir()
    if not (path / "config.json").is_file():
        from tandem.engine.tiny_model import make_model

        print(f"generating a small random model in {path} ...", flush=True)
        make_model(path)
    return path


def check_tensor_parallel(args: argparse.Namespace) -> None:
    """SystemExit for sizes below 1 (prefill and decode sizes may differ: each rank ships
    its KV heads to the ranks holding them, docs/disaggregation.md)."""
    for role in ("prefill", "decode"):
        if getattr(args, f"{role}_tensor_parallel_size") < 1:
            raise SystemExit(f"tandem serve: --{role}-tensor-parallel-size must be at least 1")


def decode_flags(args: argparse.Namespace) -> list[str]:
    """The decode nodes' own flags: the threshold, and the timeouts when given."""
    flags = ["--remote-prefill-threshold", str(args.remote_prefill_threshold)]
    for name in ("prefill_timeout", "hold_timeout"):
        if getattr(args, name) is not None:
            flags += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    return flags


def node_threads(num_nodes: int) -> int:
    """Each node's share of the CPUs this process may run on (its affinity, as a container's
    cpuset sets it): one process per core, not every node spinning on every core."""
    return max(1, len(os.sched_getaffinity(0)) // max(1, num_nodes))


def plan(args: argparse.Namespace, model: Path) -> list[Child]:
    """The command line of every child: prefill nodes, decode nodes, then the router."""
    python = [sys.executable, "-P", "-m"]
    threads = args.threads or node_threads(args.prefill + args.decode)
    common = ["--model", str(model), "--threads", str(threads), "--log-level", args.log_level]
    common += ["--dtype", args.dtype]
    for flag in ("max_model_len", "num_kv_blocks", "otlp_traces_endpoint"):
        if getattr(args, flag, None) is not None:
            common += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    if args.debug_endpoints:
        common.append("--debug-endpoints")
    children = []
    for role, count in (("prefill", args.prefill), ("decode", args.decode)):
        for i in range(count):
            http, metrics, zmq_port = free_port(), free_port(), free_port()
            cmd = [*python, f"tandem.{role}_node", *common]
            cmd += ["--http-port", str(http), "--metrics-port", str(metrics)]
            cmd += ["--zmq-port", str(zmq_port)]
            cmd += ["--tensor-parallel-size", str(getattr(args, f"{role}_tensor_parallel_size"))]
            cmd += tier_flags(args, f"{role}-{i}")
            if role == "decode":
                cmd += decode_flags(args)
            else:  # the decode nodes' size: a finer split needs staging planned at start-up
                cmd += ["--peer-tensor-parallel-sizes", str(args.decode_tensor_parallel_size)]
            label = "ZMQ requests" if role == "prefill" else "KV events"
            url = f"http://127.0.0.1:{http}"
            extra = f"{label} tcp://127.0.0.1:{zmq_port}  metrics :{metrics}"
            children.append(Child(f"{role}-{i}", cmd, url, extra))
    router = [*python, "tandem.router", "--model", str(model), "--host", args.host]
    router += ["--port", str(args.port), "--policy", args.policy, "--log-level", args.log_level]
    router += ["--tool-call-parser", args.tool_call_parser]
    router += ["--reasoning-parser", args.reasoning_parser]
    router += ["--responses-store-size", str(args.responses_store_size)]
    router += ["--kv-host-hit-cost", str(args.kv_host_hit_cost)]
    router += ["--kv-disk-hit-cost", str(args.kv_disk_hit_cost)]
    for flag in ("max_model_len", "otlp_traces_endpoint"):
        if getattr(args, flag, None) is not None:
            router += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    router += ["--prefill", *(c.url for c in children if c.name.startswith("prefill"))]
    router += ["--decode", *(c.url for c in children if c.name.startswith("decode"))]
    children.append(Child("router", router, f"http://{args.host}:{args.port}"))
    return children


def tier_flags(args: argparse.Namespace, child: str) -> list[str]:
    """The KV tier flags of one node: the sizes as given, the disk tier in `child`'s own
    folder under --kv-disk-dir (two nodes never share a tier's file)."""
    flags = ["--kv-host-gib", str(args.kv_host_gib), "--kv-disk-gib", str(args.kv_disk_gib)]
    if args.kv_disk_dir is not None:
        flags += ["--kv-disk-dir", os.path.join(args.kv_disk_dir, child)]
    return flags


def banner(children: list[Child], model_name: str) -> str:
    router = children[-1]
    lines = [f"Tandem is serving {model_name} at {router.url}/v1", ""]
    lines += [f"  {c.name:<10} {c.url}  {c.extra}".rstrip() for c in children]
    lines += [
        "",
        "Try:",
        f"  curl {router.url}/v1/completions -H 'Content-Type: application/json' \\",
        f'    -d \'{{"model": "{model_name}", "prompt": "Hello", "max_tokens": 16}}\'',
        "",
        f"Workers and their load: {router.url}/workers    Ctrl-C stops everything.",
    ]
    return "\n".join(lines)


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def restart_policy(args: argparse.Namespace) -> RestartPolicy:
    """The policy the flags ask for; SystemExit naming the problem when it is invalid."""
    try:
        return RestartPolicy(max_restarts=args.max_restarts, window_s=args.restart_window)
    except ValueError as exc:
        raise SystemExit(f"tandem serve: {exc}") from exc


def run(args: argparse.Namespace) -> None:
    """Serve until Ctrl-C, SIGINT or SIGTERM (exit 0), or until start-up fails or a child
    crashes more often than the restart policy allows (exit 1); every child is stopped
    either way."""
    if args.decode < 1 or args.prefill < 0:
        raise SystemExit("--decode must be at least 1 and --prefill at least 0")
    check_tensor_parallel(args)
    policy = restart_policy(args)
    model = ensure_model(args.model)
    children = plan(args, model)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    env = with_huge_pages(env)  # for the engines' weights and KV cache
    # the deployment's token: the children's control ports answer only each other
    env[TOKEN_ENV] = env.get(TOKEN_ENV) or DeploymentToken.generate().value
    supervisor = Supervisor(children, policy, env)
    # SIGINT too, explicitly: a background job of a non-interactive shell starts with it
    # ignored, and Python keeps that, so `kill -INT` alone would not stop serve.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _interrupt)
    code = 0
    try:
        supervisor.start()
        supervisor.wait_ready(children[-1], args.ready_timeout)
        print(banner(children, os.path.basename(os.path.normpath(model))), flush=True)
        supervisor.watch()
    except KeyboardInterrupt:
        print("stopping", file=sys.stderr)
    except (RuntimeError, TimeoutError) as exc:  # GaveUp is a RuntimeError
        print(f"tandem serve: {exc}; stopping", file=sys.stderr)
        code = 1
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):  # stopping already: a second is moot
            signal.signal(signum, signal.SIG_IGN)
        supervisor.stop()
    sys.exit(code)
