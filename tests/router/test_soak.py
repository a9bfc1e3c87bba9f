"""The fault soak (`bench/soak.py`) in small: a few dozen requests through `tandem serve`,
streamed or not, n=1 or 2, some clients leaving mid-stream, while the prefill process is
killed with SIGKILL and `tandem serve` restarts it. Outcomes are asserted, never times: no
request hangs, every failure is a clear error that a router metric counts, every node's
census balances afterwards, the restarted worker serves again, and SIGTERM then stops
`tandem serve` and every child."""

from __future__ import annotations

import json

import pytest

from tests.bench_run import run_bench
from tests.bounds import HANG_S, PROCESS_S

NUM_REQUESTS = 40


@pytest.mark.slow
def test_a_prefill_worker_killed_under_load_loses_nothing(llama_dir, tmp_path):
    out = tmp_path / "soak.json"
    args = [
        "--model", str(llama_dir), "--prefill", "1", "--decode", "1",
        "--max-model-len", "256", "--num-kv-blocks", "128",
        "--num-requests", str(NUM_REQUESTS), "--concurrency", "8",
        "--input-len", "16", "--output-len", "8", "--vocab-size", "100",
        "--kill", "prefill@0.3", "--probes", "4", "--hang-timeout", str(HANG_S),
        "--restart-timeout", str(PROCESS_S), "--settle-timeout", str(HANG_S),
        "--log", str(tmp_path / "serve.log"), "--out", str(out),
    ]  # fmt: skip
    stdout = run_bench("soak.py", *args, env={"OMP_NUM_THREADS": "1"})
    assert "requests 40 in" in stdout, stdout
    s = json.loads(out.read_text())
    outcomes = s["outcomes"]
    assert outcomes["hung"] == 0 and outcomes["unclear"] == 0, s["unclear"]
    assert sum(outcomes.values()) == NUM_REQUESTS
    assert outcomes["disconnected"] <= s["mix"]["leaving"]
    # every failure the clients saw is counted by the router, the way they saw it (the
    # router may count more: a client that left may not have seen its stream's error)
    failures = s["router_failures"]
    assert outcomes["error_status"] <= sum(v for k, v in failures.items() if k.endswith(",status"))
    assert outcomes["error_event"] <= sum(v for k, v in failures.items() if k.endswith(",event"))
    assert sum(s["router_in_flight"].values()) == 0
    # killed, restarted as a new agent, and serving again
    (kill,) = s["kills"]
    assert kill["restarted"] and kill["new_agent"] != kill["old_agent"], kill
    assert kill["served_since_restart"] > 0, kill
    assert s["router_worker_restarts"] == {"prefill": 1.0}
    assert s["probes"] == {"completed": 4}
    assert any("prefill-0 restarted" in line for line in s["supervisor"]), s["supervisor"]
    # nothing in use, held, pending or leaked on any node
    assert s["census"]["balanced"], s["census"]
    # SIGTERM (a user's Ctrl-C) stops tandem serve and every child, the restarted one too
    assert s["sigterm"] == {"exit_code": 0, "children_left": []}
