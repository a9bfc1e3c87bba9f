"""Benchmarks run end to end on tiny shapes, so their code does not rot between the sessions
that run them in full: the GPU ones under the Triton interpreter, the KV-transfer one with
real NIXL between two processes and real prefill and decode nodes. Figures are printed,
never asserted."""

from __future__ import annotations

import pytest

from tandem.engine.exec.host_memory import huge_page_bytes
from tests.bench_run import run_bench


@pytest.mark.parametrize(
    ("script", "rows"),
    [
        ("kernels.py", ["| 64 | 1 |", "| 64 | 2 |", "| 8 | 24 |"]),
        ("decode_step.py", ["| 3 | 40 |"]),
        ("transfer.py", ["| 1 | 0.0625 MiB |", "| 4 | 0.25 MiB |", "TTFT of one disaggregated"]),
        ("structured.py", ["decode step", "llguidance  tool: get_weather"]),
        (
            "tensor_parallel.py",
            ["| decode | 32 | 32 | 512 |", "| 2 | 0.3 |", "| decode-heavy | 4 | 2 | 2 |"],
        ),
        ("calibrate.py", ["steps timed: ", "fit: overhead", "median error"]),
        ("tp_transfer.py", ["| 1 -> 2 | 2.00 | 512 |", "| 2 -> 1 | 2.00 | 512 |"]),
        ("burst_phases.py", ["| burst | queue ms | remote_prefill ms | kv_transfer ms", "| 0 |"]),
        ("router_loop.py", ["nproc ", "2 streams alone", "2 streams with "]),
        ("step_profile.py", ["| ms per decode step | batch 1 | batch 4 |", "|   attention |"]),
        ("planner_decide.py", ["| rate req/s | decision s | simulations |", "| 20 | "]),
        (
            "planner_day.py",
            [
                "static for the peak: 1P+",
                "| 14:00 | 4.0 | ",
                "planner decisions (on the previous hour)",
                "| policy | SLO attainment |",
            ],
        ),
    ],
)
def test_benchmark_runs_on_tiny_shapes(script, rows):
    stdout = run_bench(script, "--smoke", env={"TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"})
    assert "\nmachine: " in stdout
    for row in rows:
        assert row in stdout, stdout


@pytest.mark.parametrize(
    ("flags", "malloc"),
    [((), "malloc: glibc defaults"), (("--keep-heap",), "malloc: glibc, mmap threshold 64 MiB")],
)
def test_offline_benchmark_runs_both_systems(flags, malloc):
    stdout = run_bench("offline.py", "--smoke", *flags, env={"OMP_NUM_THREADS": "1"})
    assert malloc in stdout, stdout
    for line in ("workload 0: 4 requests", "tandem: ", "transformers: ", "ratio: "):
        assert line in stdout, stdout
    assert "identical greedy outputs: " in stdout and "/4\n" in stdout, stdout


def test_transfer_benchmark_on_huge_pages(free_hugepages):
    free_hugepages(3)  # source, target and the copy's destination: a page each
    stdout = run_bench("transfer.py", "--smoke", "--skip-ttft", "--hugepages")
    assert f"host buffers on {huge_page_bytes() >> 20} MiB huge pages" in stdout, stdout
    for row in ("| 1 | 0.0625 MiB |", "| 4 | 0.25 MiB |"):
        assert row in stdout, stdout


def test_house_benchmark_prints_its_tables():
    stdout = run_bench("house.py", "--top", "3", "--tests")
    assert "\ndate: " in stdout and "sim, tests (Python files" in stdout, stdout
    for line in (
        "Largest 3 files:\n\n| file | lines |",
        "Largest 3 functions:\n\n| function | lines |",
        "| folder | files | lines |",
        "| `engine/` |",
        "| `tests/router/` |",
        "`# fmt: skip` markers: ",
    ):
        assert line in stdout, stdout
