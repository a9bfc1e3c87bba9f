"""`bench/serve.py` against this package's `tandem serve`: a few streamed requests, so the
load generator does not rot between the sessions that run it in full. Figures are printed,
never asserted."""

from __future__ import annotations

import json

from tests.bench_run import run_bench


def test_the_load_generator_streams_every_request_through_the_router(serve, tmp_path):
    out = tmp_path / "serve.json"
    stdout = run_bench("serve.py", "--base-url", f"{serve.url}/v1", "--num-requests", "6",
                       "--concurrency", "3", "--input-len", "16", "--output-len", "4",
                       "--vocab-size", "100", "--out", str(out))  # fmt: skip
    assert "requests 6, errors 0" in stdout
    summary = json.loads(out.read_text())
    assert summary["errors"] == 0, summary["first_errors"]
    assert [r["output_tokens"] for r in summary["results"]] == [4] * 6
    assert all(r["ttft"] > 0 and r["e2e"] >= r["ttft"] for r in summary["results"])
