"""Benchmarks run end to end on tiny shapes, so their code does not rot between the sessions
that run them in full: the GPU ones under the Triton interpreter, the KV-transfer one with
real NIXL between two processes and real prefill and decode nodes. Figures are printed,
never asserted."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.parametrize(
    ("script", "rows"),
    [
        ("kernels.py", ["| 64 | 1 |", "| 64 | 2 |", "| 8 | 24 |"]),
        ("decode_step.py", ["| 3 | 40 |"]),
        ("transfer.py", ["| 1 | 0.0625 MiB |", "| 4 | 0.25 MiB |", "TTFT of one disaggregated"]),
    ],
)
def test_benchmark_runs_on_tiny_shapes(script, rows):
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-P", str(BENCH / script), "--smoke"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("command: ") and "\nmachine: " in result.stdout
    for row in rows:
        assert row in result.stdout, result.stdout
