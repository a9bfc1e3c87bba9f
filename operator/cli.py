"""`tandem operator`: reconcile LLMDeployments (in one namespace or all), or `--render FILE`
to print the children of a resource offline, like `helm template`."""

from __future__ import annotations

import argparse
import logging
import os
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("--namespace", action="append", default=[], help="watch only these")
    scope.add_argument("--all-namespaces", action="store_true", help="watch every namespace")
    parser.add_argument("--render", metavar="FILE", help="print the children of FILE and exit")
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between resyncs")
    parser.add_argument(
        "--leader-election", action=argparse.BooleanOptionalAction, default=True,
        help="hold a Lease so that only one replica reconciles",
    )  # fmt: skip
    parser.add_argument(
        "--lease-duration", type=float, default=15.0,
        help="seconds a leader holds the Lease without renewing it (it steps down after "
        "two thirds of that without a renewal)",
    )  # fmt: skip
    parser.add_argument(
        "--lease-namespace", default=os.environ.get("POD_NAMESPACE", "default"),
        help="namespace of the leader Lease (default: $POD_NAMESPACE)",
    )  # fmt: skip
    parser.add_argument("--probe-port", type=int, default=8080, help="/metrics and /healthz")
    parser.add_argument(
        "--liveness-period", type=float, default=5.0,
        help="seconds between the API server checks behind /healthz",
    )  # fmt: skip
    parser.add_argument(
        "--liveness-grace", type=float, default=30.0,
        help="/healthz fails after this many seconds without a successful API server call; "
        "credentials refused for as long are fatal",
    )  # fmt: skip
    parser.add_argument("--log-level", default="info")


def run(args: argparse.Namespace) -> None:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    if args.render:
        sys.exit(render_file(args.render))
    if not args.namespace and not args.all_namespaces:
        sys.exit("tandem operator: give --namespace NS (repeatable) or --all-namespaces")
    from tandem.operator.lifecycle import exit_process, operate

    exit_process(operate(args))


def render_file(path: str) -> int:
    import yaml

    from tandem.operator.manifest import dump
    from tandem.operator.render import render

    with open(path) as f:
        llmd = yaml.safe_load(f)
    try:
        objects = render(llmd)
    except ValueError as exc:
        print(f"{path}: {exc}", file=sys.stderr)
        return 1
    print(dump(objects), end="")
    return 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tandem.operator")
    add_arguments(parser)
    run(parser.parse_args(argv))
