"""`tandem simulate` end to end: figures printed, a JSON result and a PNG written, bad input
refused with a clear message."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.bounds import PROCESS_S


def tandem(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-P", "-m", "tandem.engine.cli", *args],
        capture_output=True,
        text=True,
        timeout=PROCESS_S,
    )


def test_simulate_writes_a_result_per_load_and_a_plot(tmp_path):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    result = tandem(
        "simulate", "--num-requests", "80", "--rate", "20", "--prompt-tokens", "64,512",
        "--output-tokens", "4,32", "--prefill", "1", "--decode", "2", "--threshold", "128",
        "--load-factors", "0.5,2", "--out", str(out), "--plot", str(png),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("80/80 done") == 2
    data = json.loads(out.read_text())
    assert [r["load_factor"] for r in data["runs"]] == [0.5, 2.0]
    low, high = data["runs"]
    assert high["offered_rps"] == 4 * low["offered_rps"]
    for r in data["runs"]:
        assert r["ttft_s"]["p50"] <= r["ttft_s"]["p90"] <= r["ttft_s"]["p99"]
        assert 0 < r["goodput_rps"] <= r["throughput_rps"]
        assert r["pools"]["decode"]["nodes"] == 2
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_simulate_refuses_bad_input_clearly(tmp_path):
    result = tandem("simulate", "--device", "tpu-v9")
    assert result.returncode != 0 and "unknown device profile" in result.stderr
    result = tandem("simulate", "--policy", "random", "--num-requests", "2")
    assert result.returncode != 0 and "unknown policy" in result.stderr
    result = tandem("simulate", "--workload", str(tmp_path / "missing.jsonl"))
    assert result.returncode != 0 and "missing.jsonl" in result.stderr
