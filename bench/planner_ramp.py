"""Issue 43's ramp on the real node: a load that ramps up and down (1, 4, 8, 4, 1 streaming
clients), served by the decode pool the SLO planner sizes (1..2 pods) and by the pool fixed
at 1 and at 2 pods: requests, failures, SLO attainment as the clients saw it, TTFT and TPOT
percentiles, and the decode pool's pod-seconds.

    TANDEM_KUBE_BIN=/opt/kube/bin python -P bench/planner_ramp.py [--ttft-ms 2000]
        [--tpot-ms 150]

It builds the e2e image (`make e2e-image`) and runs tests/operator/e2e/ramp_bench.py on the
e2e suite's control plane and node (docs/kubernetes.md "Tests on a real node"), then prints
the command, the machine and a table. The HPA path cannot run there: its metrics need an
adapter of the custom metrics API, which this machine cannot build; the simulated day
(bench/planner_day.py) compares it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe_host  # bench/machine.py

ROOT = Path(__file__).resolve().parents[1]
RUNS = ("planner", "static_1", "static_2")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ttft-ms", type=float, default=2000.0)
    parser.add_argument("--tpot-ms", type=float, default=150.0)
    return parser.parse_args()


def run(args: argparse.Namespace, report: Path) -> int:
    env = os.environ | {
        "TANDEM_E2E_REPORT": str(report),
        "TANDEM_RAMP_TTFT_MS": str(args.ttft_ms),
        "TANDEM_RAMP_TPOT_MS": str(args.tpot_ms),
    }
    subprocess.run(["make", "e2e-image"], cwd=ROOT, check=True)
    test = "tests/operator/e2e/ramp_bench.py"
    argv = [sys.executable, "-P", "-m", "pytest", "-q", "-m", "e2e", "-p", "no:cacheprovider"]
    return subprocess.run([*argv, test], cwd=ROOT, env=env).returncode


def print_table(found: dict) -> None:
    slo = found["slo"]
    print(f"SLO: TTFT {slo['ttft_ms']:g} ms, TPOT {slo['tpot_ms']:g} ms; ramp {found['ramp']}")
    print("| run | requests | failed | attainment | TTFT p50/p90 ms | TPOT p50/p90 ms "
          "| decode pod-s | mean decode pods |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in RUNS:
        r = found[name]
        print(f"| {name} | {r['requests']} | {r['failed']} | {r['attainment']:.1%} "
              f"| {r['ttft_p50_ms']}/{r['ttft_p90_ms']} | {r['tpot_p50_ms']}/{r['tpot_p90_ms']} "
              f"| {r['decode_pod_seconds']} | {r['decode_mean_pods']} |")  # fmt: skip
    print(f"planner's decode pods over time (s, pods): {found['planner']['decode_timeline']}")
    print(f"planner's last reason: {found['planner'].get('last_reason')}")


def main() -> int:
    args = parse_args()
    print(f"command: python -P bench/planner_ramp.py {' '.join(sys.argv[1:])}".rstrip())
    print(f"machine: {describe_host()}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        code = run(args, report)
        if not report.is_file():
            print("no figures: the run failed before it measured (pytest's output above)")
            return code or 1
        found = json.loads(report.read_text())["planner_ramp"]
    print_table(found)
    return code


if __name__ == "__main__":
    sys.exit(main())
