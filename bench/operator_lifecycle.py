"""How fast the operator acts on a real API server: start to leading, an LLMDeployment
created to every child applied, SIGTERM to exit (and the lease handed over), a SIGKILLed
leader replaced by its standby, and a spec change to the rolled Deployment.

    TANDEM_KUBE_BIN=/opt/kube/bin python -P bench/operator_lifecycle.py [--runs 3]

It uses the e2e suite's control plane (etcd, kube-apiserver, kube-controller-manager on
loopback) and runs `tandem operator` as the chart's ServiceAccount. Prints the command, the
machine and each phase's seconds per run.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe_host  # bench/machine.py

from tandem.operator.kinds import DEPLOYMENT
from tests.operator.e2e.cluster import OperatorProc, install
from tests.operator.e2e.conftest import admin_api
from tests.operator.e2e.control_plane import ControlPlane, kube_bin
from tests.operator.e2e.helpers import (
    all_children_exist,
    create,
    delete,
    llmd_from,
    patch_spec,
    read,
)


def timed(until: Callable[[], bool], bound_s: float = 300) -> float:
    """Seconds until `until()` holds (polled every 20 ms)."""
    start = time.monotonic()
    while not until():
        if time.monotonic() - start > bound_s:
            raise TimeoutError(f"not within {bound_s}s")
        time.sleep(0.02)
    return time.monotonic() - start


def leading(proc: OperatorProc) -> bool:
    try:
        return proc.counter("tandem_operator_leader") == 1
    except Exception:  # not answering yet
        return False


def one_run(setup, logs: Path, run: int) -> dict[str, float]:
    api, figures = setup.api, {}
    first = OperatorProc(logs, setup, f"bench-a{run}").start()
    figures["start to leading"] = timed(lambda: leading(first))
    llmd = llmd_from(f"bench-{run}", setup.watched)
    start = time.monotonic()
    create(api, llmd)
    timed(lambda: (live := read(api, llmd)) is not None and all_children_exist(api, live))
    figures["create to all children applied"] = time.monotonic() - start
    name = f"{llmd['metadata']['name']}-decode"
    start = time.monotonic()
    patch_spec(api, llmd, {"decode": {"replicas": 2}})
    timed(lambda: api.get(DEPLOYMENT, setup.watched, name)["spec"]["replicas"] == 2)
    figures["spec change to Deployment updated"] = time.monotonic() - start
    second = OperatorProc(logs, setup, f"bench-b{run}").start()
    timed(lambda: second.healthz() == 200)
    start = time.monotonic()
    first.proc.send_signal(signal.SIGTERM)
    first.proc.wait(60)
    figures["SIGTERM to exit"] = time.monotonic() - start
    figures["SIGTERM to standby leading"] = (
        timed(lambda: leading(second)) + figures["SIGTERM to exit"]
    )
    third = OperatorProc(logs, setup, f"bench-c{run}").start()
    timed(lambda: third.healthz() == 200)
    second.kill()
    figures["SIGKILL to standby leading (15 s lease)"] = timed(lambda: leading(third))
    third.stop()
    delete(api, llmd)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    bin_dir = kube_bin()
    if bin_dir is None:
        sys.exit(
            "set TANDEM_KUBE_BIN to a folder with etcd, kube-apiserver, kube-controller-manager"
        )
    print(f"command: {' '.join(sys.argv)}")
    print(f"machine: {describe_host()}")
    work = Path(tempfile.mkdtemp(prefix="tandem-operator-bench-"))
    start = time.monotonic()
    plane = ControlPlane(bin_dir, work).start()
    print(f"control plane ready in {time.monotonic() - start:.1f} s")
    try:
        api, server, _ = admin_api(plane.dir / "admin.kubeconfig")
        setup = install(api, server, plane.ca, work, uuid.uuid4().hex[:6])
        runs = [one_run(setup, work, i) for i in range(args.runs)]
    finally:
        plane.stop()
    print(f"{'phase':<42} {'median':>8} {'min':>8} {'max':>8}  (seconds)")
    for phase in runs[0]:
        values = [r[phase] for r in runs]
        print(f"{phase:<42} {statistics.median(values):8.2f} {min(values):8.2f} {max(values):8.2f}")


if __name__ == "__main__":
    main()
