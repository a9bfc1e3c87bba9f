"""`tandem simulate` end to end: figures printed, a JSON result and a PNG written, bad input
refused with a clear message."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.bounds import PROCESS_S


def tandem(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-P", "-m", "tandem.cli", *args],
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


def test_simulate_with_failures_reports_them(tmp_path):
    out = tmp_path / "r.json"
    result = tandem(
        "simulate", "--num-requests", "120", "--rate", "40", "--prompt-tokens", "1000,3000",
        "--output-tokens", "4,32", "--prefill", "1", "--decode", "2",
        "--kill-prefill", "0@1+0.5", "--abort-share", "0.25", "--abort-after", "0.2",
        "--hold-timeout", "10", "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "failures: " in result.stdout and "blocks held at the end" in result.stdout
    run = json.loads(out.read_text())["runs"][0]
    f = run["failures"]
    assert f["prefill_deaths"] == 1 and f["prefill_restarts"] == 1
    assert f["aborted"] > 0 and f["fallbacks"] and f["held_blocks_at_end"] == 0
    assert run["num_finished"] + f["aborted"] + f["errors"] == 120


def test_simulate_refuses_bad_failures():
    result = tandem("simulate", "--kill-prefill", "one@2", "--num-requests", "2")
    assert result.returncode != 0 and "WORKER@SECONDS" in result.stderr
    result = tandem("simulate", "--kill-prefill", "4@2", "--num-requests", "2")
    assert result.returncode != 0 and "there are 1" in result.stderr


def test_simulate_with_a_decode_death_reports_it(tmp_path):
    out = tmp_path / "r.json"
    result = tandem(
        "simulate", "--num-requests", "120", "--rate", "40", "--prompt-tokens", "1000,3000",
        "--output-tokens", "20,60", "--prefill", "1", "--decode", "2",
        "--kill-decode", "0@1+0.5", "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "decode deaths 1, restarts 1" in result.stdout
    run = json.loads(out.read_text())["runs"][0]
    f = run["failures"]
    assert f["decode_deaths"] == 1 and f["decode_restarts"] == 1
    assert sum(f["decode_death_outcomes"].values()) > 0 and f["held_blocks_at_end"] == 0
    assert f["router_retries"]["decode_failed"] == f["decode_death_outcomes"].get("finished", 0)
    assert run["num_finished"] + f["aborted"] + f["errors"] == 120


def test_simulate_refuses_bad_decode_deaths():
    result = tandem("simulate", "--kill-decode", "0@later", "--num-requests", "2")
    assert result.returncode != 0 and "--kill-decode" in result.stderr
    assert "WORKER@SECONDS" in result.stderr
    result = tandem("simulate", "--kill-decode", "2@1", "--decode", "2", "--num-requests", "2")
    assert result.returncode != 0 and "decode worker 2: there are 2" in result.stderr
