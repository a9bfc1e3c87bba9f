"""`tandem router`: flags here, the server imported only when it runs."""

from __future__ import annotations

import argparse
import os

from tandem.engine.telemetry.tracing import add_tracing_argument
from tandem.router.cpu_pool import DEFAULT_WORKERS
from tandem.router.policy import DEFAULT_TIER_COSTS

POLICY_NAMES = ("kv-aware", "prefix-aware", "least-load", "round-robin")
# tandem.router.structured.TOOL_PARSER_CHOICES, named here so `--help` imports no torch
TOOL_PARSER_CHOICES = ("auto", "none", "hermes", "llama3_json", "mistral")


def add_tool_call_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tool-call-parser",
        choices=TOOL_PARSER_CHOICES,
        default="auto",
        help="the format the model writes tool calls in (default: found from its chat "
        "template: <tool_call> hermes, [TOOL_CALLS] mistral, <|python_tag|> llama3_json)",
    )


# tandem.router.reasoning.REASONING_PARSER_CHOICES, likewise
REASONING_PARSER_CHOICES = ("auto", "none", "qwen3", "deepseek_r1")


def add_reasoning_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--reasoning-parser",
        choices=REASONING_PARSER_CHOICES,
        default="auto",
        help="how the model marks its reasoning, sent as reasoning_content (default: found "
        "from its chat template: none unless it mentions <think>; deepseek_r1 when its "
        "generation prompt leaves <think> open, else qwen3)",
    )


# tandem.router.response_store.DEFAULT_SIZE, likewise
RESPONSES_STORE_SIZE = 1000


def add_responses_store_size(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--responses-store-size",
        type=int,
        default=RESPONSES_STORE_SIZE,
        help="Responses API responses kept for GET /v1/responses/{id} and "
        "previous_response_id, least recently used out first; in this router's memory "
        f"only, lost on restart (default: {RESPONSES_STORE_SIZE}; 0 keeps none)",
    )


def hit_cost(text: str) -> float:
    """argparse type of the --kv-*-hit-cost flags: a fraction of a computed block."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:  # NaN fails too
        raise argparse.ArgumentTypeError(
            f"{text} is not within [0, 1] (0: as cheap as a device hit, 1: as dear as "
            "computing the block)"
        )
    return value


def add_kv_tier_costs(parser: argparse.ArgumentParser) -> None:
    """What kv-aware routing counts a prompt block that a worker holds in a lower KV tier,
    in blocks of prefill work (docs/router.md: why these defaults)."""
    costs = DEFAULT_TIER_COSTS
    parser.add_argument(
        "--kv-host-hit-cost",
        type=hit_cost,
        default=costs.host_hit_cost,
        help="kv-aware: the cost of a prompt block found in a worker's host-memory tier, "
        f"from 0 (a device hit) to 1 (a miss, computed) (default: {costs.host_hit_cost})",
    )
    parser.add_argument(
        "--kv-disk-hit-cost",
        type=hit_cost,
        default=costs.disk_hit_cost,
        help="kv-aware: the cost of a prompt block found in a worker's disk tier, likewise "
        f"(default: {costs.disk_hit_cost})",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="model folder (tokenizer, config.json)")
    parser.add_argument("--served-model-name", default=None, help="model id (default: folder)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--block-size", type=int, default=16, help="the nodes' KV block size")
    parser.add_argument("--policy", choices=POLICY_NAMES, default="kv-aware")
    add_kv_tier_costs(parser)
    parser.add_argument("--discovery", choices=("static", "kubernetes"), default="static")
    parser.add_argument("--prefill", nargs="*", default=[], metavar="URL", help="static workers")
    parser.add_argument("--decode", nargs="*", default=[], metavar="URL", help="static workers")
    parser.add_argument("--selector", default="", help="EndpointSlice label selector")
    parser.add_argument("--namespace", default=None, help="default: the pod's namespace")
    parser.add_argument(
        "--api-key",
        action="append",
        default=[k for k in [os.environ.get("TANDEM_API_KEY")] if k],
        help="accepted bearer key (repeatable; default: $TANDEM_API_KEY; none: no auth)",
    )
    parser.add_argument(
        "--max-inflight", type=int, default=256, help="choices in progress (prompts x n) before 429"
    )
    parser.add_argument("--max-attempts", type=int, default=3, help="decode workers per choice")
    parser.add_argument(
        "--cpu-workers",
        type=int,
        default=DEFAULT_WORKERS,
        help="threads that preprocess requests (chat template, tokenizing, block hashes, "
        f"grammars) off the event loop, so a long prompt does not hold other streams "
        f"(default: {DEFAULT_WORKERS}; tokenizing runs without the GIL, on up to this many cores)",
    )
    parser.add_argument("--health-interval", type=float, default=1.0, help="seconds")
    parser.add_argument(
        "--health-timeout",
        type=float,
        default=5.0,
        help="seconds a health check may take before it counts as failed (a busy node on a "
        "busy machine answers late, and is not dead)",
    )
    parser.add_argument(
        "--worker-read-timeout",
        type=float,
        default=60.0,
        help="seconds a decode worker's stream may go without a record before the choice "
        "fails (retried elsewhere before its first token, else an error event) and is "
        "aborted there",
    )
    parser.add_argument(
        "--timeout-keep-alive",
        type=int,
        default=75,
        help="seconds an idle client connection stays open (uvicorn's default, 5, is what "
        "HTTP clients such as the OpenAI SDK keep one for: a request can race the close; "
        "behind a load balancer, make it longer than the balancer's idle timeout)",
    )
    add_tool_call_parser(parser)
    add_reasoning_parser(parser)
    add_responses_store_size(parser)
    add_tracing_argument(parser)
    parser.add_argument("--log-level", default="info")


def run(args: argparse.Namespace) -> None:
    from tandem.router.server import run as serve

    serve(args)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tandem.router")
    add_arguments(parser)
    run(parser.parse_args(argv))
