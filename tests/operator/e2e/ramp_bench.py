"""Issue 43's ramp on the real node, a benchmark: `bench/planner_ramp.py` runs this file
(`make test-e2e` does not collect it: its name is not `test_*`).

One load that ramps up and down (`RAMP`: streaming openai clients, each asking back to back)
is served three times by the same deployment (SmolLM2 on the node's CPU, one prefill pod):
the decode pool planned by `spec.slo` (1..2 pods), then fixed at 1 and at 2 pods, the sizes
around the planner's mean. Per run: the requests, the failed ones, the SLO attainment as the
clients saw it (both their TTFT and their mean gap between tokens within the targets), the
TTFT and TPOT medians and 90th percentiles, and the decode pool's pod-seconds (its Ready
pods, sampled every second); for the planner, its replica timeline and mean size. Figures
go to $TANDEM_E2E_REPORT (key `planner_ramp`). Asserted: no request fails, in any run.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import numpy as np
import pytest

from tests.disagg.nodes import wait_until
from tests.operator.e2e.helpers import patch_spec
from tests.operator.e2e.journey import Outcome, Served, StreamLoad, is_ready, report

pytestmark = pytest.mark.e2e
START_S = 900  # a pod's cold start bound: a hang, not a slow machine, reaches it
RAMP = ((1, 45.0), (4, 45.0), (8, 90.0), (4, 45.0), (1, 75.0))  # (streams, seconds)
TTFT_MS = float(os.environ.get("TANDEM_RAMP_TTFT_MS", "2000"))
TPOT_MS = float(os.environ.get("TANDEM_RAMP_TPOT_MS", "150"))
SLO = {
    "ttftMs": TTFT_MS, "tpotMs": TPOT_MS, "attainment": 0.9, "interval": "10s",
    "scaleDownWindow": "60s", "cooldown": "10s", "decode": {"minReplicas": 1, "maxReplicas": 2},
}  # fmt: skip


class PodSeconds:
    """Samples a role's Ready pods every second while it runs: their integral over time,
    and the timeline of changes (seconds from the start, count)."""

    def __init__(self, served: Served, role: str) -> None:
        self.served, self.role = served, role
        self.pod_seconds, self.timeline = 0.0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> PodSeconds:
        self._start = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def mean(self) -> float:
        return self.pod_seconds / max(1e-9, time.monotonic() - self._start)

    def _sample(self) -> None:
        last = time.monotonic()
        while not self._stop.is_set():
            count = len(self.served.ready_ips(self.role))
            now = time.monotonic()
            self.pod_seconds += count * (now - last)
            last = now
            if not self.timeline or self.timeline[-1][1] != count:
                self.timeline.append((round(now - self._start, 1), count))
            self._stop.wait(1.0)


def figures(outcomes: list[Outcome], decode: PodSeconds) -> dict[str, Any]:
    done = [o for o in outcomes if o.error is None and o.tpot_s() is not None]
    assert done, f"no request of {len(outcomes)} finished with two tokens"
    ttft = np.array([o.ttft_s() for o in done])
    tpot = np.array([o.tpot_s() for o in done])
    met = (ttft <= TTFT_MS / 1000) & (tpot <= TPOT_MS / 1000)
    return {
        "requests": len(outcomes),
        "failed": sum(o.error is not None for o in outcomes),
        "attainment": round(float(met.mean()), 3),
        "ttft_p50_ms": round(float(np.percentile(ttft, 50)) * 1000),
        "ttft_p90_ms": round(float(np.percentile(ttft, 90)) * 1000),
        "tpot_p50_ms": round(float(np.percentile(tpot, 50)) * 1000),
        "tpot_p90_ms": round(float(np.percentile(tpot, 90)) * 1000),
        "decode_pod_seconds": round(decode.pod_seconds),
        "decode_mean_pods": round(decode.mean(), 2),
        "decode_timeline": decode.timeline,
    }


def serve_ramp(ready: Served) -> dict[str, Any]:
    """The ramp once; each phase's clients finish the request they hold."""
    outcomes: list[Outcome] = []
    with PodSeconds(ready, "decode") as decode:
        for streams, seconds in RAMP:
            with StreamLoad(ready.router_url(), concurrency=streams) as load:
                time.sleep(seconds)  # the phase's length: the load, not a wait for a state
            outcomes += load.outcomes
    return figures(outcomes, decode)


def settle(ready: Served, spec: dict[str, Any], decode: int) -> None:
    patch_spec(ready.api, ready.ref(), spec)
    assert wait_until(lambda: ready.routers_follow("decode", decode), timeout=START_S)


def test_a_ramp_served_by_the_planner_and_by_fixed_pools(ready):
    runs: dict[str, Any] = {"slo": {"ttft_ms": TTFT_MS, "tpot_ms": TPOT_MS}, "ramp": RAMP}
    settle(ready, {"decode": {"replicas": 1}, "prefill": {"replicas": 1}}, 1)
    patch_spec(ready.api, ready.ref(), {"slo": SLO})
    assert wait_until(lambda: any(is_ready(p) for p in ready.current("planner")), timeout=START_S)
    runs["planner"] = serve_ramp(ready)
    planner = ready.resource()["status"].get("planner", {})
    runs["planner"]["last_reason"] = planner.get("reason")
    settle(ready, {"slo": None, "decode": {"replicas": 1}}, 1)
    runs["static_1"] = serve_ramp(ready)
    settle(ready, {"decode": {"replicas": 2}}, 2)
    runs["static_2"] = serve_ramp(ready)
    report("planner_ramp", runs)
    for name in ("planner", "static_1", "static_2"):
        assert runs[name]["failed"] == 0, (name, runs[name])
