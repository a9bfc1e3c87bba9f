"""`tandem prefill`: flags here, the server imported only when it runs."""

from __future__ import annotations

import argparse
import os

from tandem.node.flags import add_engine_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_arguments(parser)
    parser.add_argument(
        "--events-port",
        type=int,
        default=0,
        help="ZMQ PUB port for KV events and load (0: any free port, reported by /health)",
    )
    parser.add_argument(
        "--peer-tensor-parallel-sizes",
        type=int,
        nargs="+",
        default=_sizes(os.environ.get("TANDEM_PEER_TENSOR_PARALLEL_SIZES", "")),
        help="tensor-parallel sizes of the decode nodes this node writes KV to: a size that "
        "splits our KV heads finer than ours needs staging mirrors as large as the KV cache, "
        "planned at start-up (fewer KV blocks); a write needing one not planned is refused "
        "(default: $TANDEM_PEER_TENSOR_PARALLEL_SIZES, comma-separated; none: our own size)",
    )


def _sizes(text: str) -> list[int]:
    return [int(s) for s in text.replace(",", " ").split()]


def run(args: argparse.Namespace) -> None:
    from tandem.prefill_node.server import run as serve

    serve(args)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tandem.prefill_node")
    add_arguments(parser)
    run(parser.parse_args(argv))
