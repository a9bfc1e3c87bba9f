"""The KV tier flags (docs/kv-tiers.md), shared by every node and by `tandem serve`, which
passes them on to its nodes; no engine import, so the router's process stays light."""

from __future__ import annotations

import argparse


def add_tier_arguments(parser: argparse.ArgumentParser) -> None:
    """The lower KV tiers (docs/kv-tiers.md)."""
    parser.add_argument(
        "--kv-host-gib", type=float, default=0.0,
        help="a host-memory KV tier of this many GiB under the device pool: evicted blocks "
        "stay there, and a prefix hit in it is loaded back (default 0: none)",
    )  # fmt: skip
    parser.add_argument(
        "--kv-disk-gib", type=float, default=0.0,
        help="a disk KV tier of this many GiB under the host tier (a file in --kv-disk-dir; "
        "default 0: none)",
    )  # fmt: skip
    parser.add_argument(
        "--kv-disk-dir", default=None, help="the folder of the disk KV tier's file"
    )  # fmt: skip
