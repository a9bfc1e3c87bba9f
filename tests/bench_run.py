"""Runs one script of `bench/` as its own process, the way the docs tell users to."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.bounds import PROCESS_S

BENCH = Path(__file__).resolve().parents[1] / "bench"


def run_bench(script: str, *args: str, env: dict[str, str] | None = None) -> str:
    """`python -P bench/<script> <args>`; asserts that it exits cleanly and prints its command
    first, as every benchmark does, and returns its stdout."""
    result = subprocess.run(
        [sys.executable, "-P", str(BENCH / script), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=PROCESS_S,  # a bound for a hang: the benchmarks' own pace varies by machine
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("command: "), result.stdout
    return result.stdout
