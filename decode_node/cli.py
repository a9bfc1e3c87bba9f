"""`tandem decode`: flags here, the server imported only when it runs."""

from __future__ import annotations

import argparse

from tandem.node.flags import add_engine_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_arguments(parser)
    parser.add_argument(
        "--remote-prefill-threshold",
        type=int,
        default=0,
        help="prefill remotely when at least this many prompt tokens are uncached "
        "(0: always, whenever the router names a prefill worker)",
    )
    parser.add_argument("--on-prefill-failure", choices=("recompute", "fail"), default="recompute")
    parser.add_argument(
        "--prefill-timeout",
        type=float,
        default=30.0,
        help="seconds to wait for a prefill worker before failing over",
    )
    parser.add_argument(
        "--hold-timeout",
        type=float,
        default=120.0,
        help="seconds the blocks of an abandoned transfer stay held without an answer",
    )


def run(args: argparse.Namespace) -> None:
    from tandem.decode_node.server import run as serve

    serve(args)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tandem.decode_node")
    add_arguments(parser)
    run(parser.parse_args(argv))
