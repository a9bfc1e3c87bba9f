"""Streamed tool-call parsing: the router's cost of one long tool call, sent a few
characters at a time as a decode node streams it.

For each format, one call whose arguments hold a string of `--chars` characters is fed to
`ToolCallStream.update` in pieces of `--piece` characters (about one token each), as the
router does on its event loop for every record. Prints the total time, the time per piece
and the slowest piece: work that grows with the text already seen shows as a total that
grows with the square of `--chars`, and as a slowest piece far above the mean.

    python -P bench/tool_stream.py [--chars 50000] [--piece 4] [--formats hermes ...]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe_host

from tandem.router.tool_parsers import PARSERS
from tandem.router.tool_stream import ToolCallStream


class NoTokenizer:
    """Parsing reads no tokenizer; the parsers' constructors only ask for special tokens."""

    def __init__(self) -> None:
        self.all_special_tokens: list[str] = []


def call_text(fmt: str, num_chars: int) -> str:
    arguments = {"path": "notes.txt", "text": "lorem ipsum " * (num_chars // 12)}
    if fmt == "hermes":
        body = json.dumps({"name": "write_file", "arguments": arguments})
        return f"Writing it.\n<tool_call>\n{body}\n</tool_call>"
    if fmt == "llama3_json":
        return json.dumps({"name": "write_file", "parameters": arguments})
    return "[TOOL_CALLS]" + json.dumps([{"name": "write_file", "arguments": arguments}])


def time_stream(fmt: str, text: str, piece: int) -> tuple[float, float, int]:
    """(total seconds, slowest piece's seconds, pieces) for streaming `text`."""
    stream = ToolCallStream(PARSERS[fmt](NoTokenizer()))
    ends = [*range(piece, len(text), piece), len(text)]
    slowest, start = 0.0, time.perf_counter()
    for end in ends:
        before = time.perf_counter()
        stream.update(text[:end], final=end == len(text))
        slowest = max(slowest, time.perf_counter() - before)
    return time.perf_counter() - start, slowest, len(ends)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chars", type=int, default=50_000, help="characters of arguments")
    parser.add_argument("--piece", type=int, default=4, help="characters per streamed piece")
    parser.add_argument("--formats", nargs="+", default=sorted(PARSERS), choices=sorted(PARSERS))
    args = parser.parse_args()
    print(f"command: python -P {' '.join(sys.argv)}")
    print(f"machine: {describe_host()}; uname -a: {' '.join(platform.uname())}")
    print(f"{'format':<12} {'chars':>7} {'pieces':>7} {'total s':>9} {'us/piece':>9} {'max ms':>8}")
    for fmt in args.formats:
        text = call_text(fmt, args.chars)
        total, slowest, num_pieces = time_stream(fmt, text, args.piece)
        print(
            f"{fmt:<12} {len(text):>7} {num_pieces:>7} {total:>9.3f} "
            f"{total / num_pieces * 1e6:>9.1f} {slowest * 1e3:>8.2f}"
        )


if __name__ == "__main__":
    main()
