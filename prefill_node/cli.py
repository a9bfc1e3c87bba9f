"""`tandem prefill`: flags here, the server imported only when it runs."""

from __future__ import annotations

import argparse

from tandem.engine.node_core import add_engine_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_arguments(parser)
    parser.add_argument(
        "--events-port",
        type=int,
        default=0,
        help="ZMQ PUB port for KV events and load (0: any free port, reported by /health)",
    )


def run(args: argparse.Namespace) -> None:
    from tandem.prefill_node.server import run as serve

    serve(args)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tandem.prefill_node")
    add_arguments(parser)
    run(parser.parse_args(argv))
