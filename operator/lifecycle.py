"""The operator process from start to exit: probes, the API liveness check, leader election,
kopf, and how it ends.

The main thread supervises: it owns the signals and the exit code, and kopf runs in a
worker thread (kopf then leaves signals alone and stops on our flag). Whatever ends the run
(SIGTERM or SIGINT, a fatal error, a lost lease, kopf returning or failing) sets one stop
flag; the process exits within `EXIT_TIMEOUT_S` of it even if a handler hangs, and at once
when the lease was lost (controller-runtime's zero graceful-shutdown timeout then): a
standby may lead soon, and a reconcile still running here must not write after it does.

Exit codes: 0 when stopped by a signal; 1 on a fatal error (credentials or permissions
refused, kopf failed, the lease lost: the pod restarts, as a standby if another leads).
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tandem.operator.kube import KubeApi
    from tandem.operator.leader import LeaderElector
    from tandem.operator.metrics import OperatorMetrics

logger = logging.getLogger(__name__)

LEASE_NAME = "tandem-operator"
EXIT_TIMEOUT_S = 10.0


class Run:
    """The stop flag and why the run ended (the first fatal reason wins)."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.fatal: str | None = None
        self.at_once = False  # exit without waiting for kopf's handlers

    def fail(self, reason: str, at_once: bool = False) -> None:
        if self.fatal is None:
            logger.error("stopping: %s", reason)
            self.fatal = reason
        self.at_once = self.at_once or at_once
        self.stop.set()

    def exit_code(self) -> int:
        return 1 if self.fatal is not None else 0


def operate(args: argparse.Namespace) -> int:
    """Run until stopped; returns the exit code."""
    from prometheus_client import CollectorRegistry

    from tandem.operator.kube import KubeApi
    from tandem.operator.liveness import ApiLiveness
    from tandem.operator.metrics import OperatorMetrics, serve_probes

    run = Run()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: run.stop.set())
    api = KubeApi.from_environment()
    namespace = None if args.all_namespaces else args.namespace[0]
    liveness = ApiLiveness(lambda: api.probe(namespace), args.liveness_period, args.liveness_grace)
    metrics = OperatorMetrics(CollectorRegistry())
    serve_probes(metrics.registry, "0.0.0.0", args.probe_port, liveness.health)
    if (refused := _refused_at_start(liveness.probe)) is not None:
        run.fail(refused)
        return run.exit_code()
    threading.Thread(target=liveness.run, args=(run.stop, run.fail), daemon=True).start()
    elector = _lead(api, args, metrics, run) if args.leader_election else None
    if args.leader_election and elector is None:
        return run.exit_code()
    worker = threading.Thread(target=_run_kopf, args=(api, args, metrics, run), daemon=True)
    worker.start()
    stopped = wait_for_stop(run, worker)
    if stopped and elector is not None and run.fatal is None:
        elector.release()  # reconciling has stopped: a standby may lead at once
    return run.exit_code()


def wait_for_stop(run: Run, worker: threading.Thread) -> bool:
    """Block until the run stops, then give kopf's thread `EXIT_TIMEOUT_S` to end (none
    when `run.at_once`); whether it ended."""
    while not run.stop.wait(1.0):
        pass
    worker.join(0 if run.at_once else EXIT_TIMEOUT_S)
    if worker.is_alive():
        logger.error("kopf did not stop%s; exiting anyway",
                     "" if run.at_once else f" within {EXIT_TIMEOUT_S:.0f}s")  # fmt: skip
        return False
    return True


def _refused_at_start(probe: Callable[[], None]) -> str | None:
    """Credentials or permissions refused on the very first call: nothing can work, so say
    so and exit (an unreachable server is not fatal: /healthz reports it)."""
    from tandem.operator.kube import ApiError

    try:
        probe()
    except ApiError as exc:
        if exc.status in (401, 403):
            return f"the API server refused the operator's first call: {exc}"
        logger.warning("API server not reachable yet: %s", exc)
    return None


def _lead(
    api: KubeApi, args: argparse.Namespace, metrics: OperatorMetrics, run: Run
) -> LeaderElector | None:
    """Wait for the lease, then keep renewing it in a thread; the elector, or None if
    stopped first."""
    from tandem.operator.leader import LeaderElector

    identity = f"{os.environ.get('POD_NAME') or socket.gethostname()}_{os.getpid()}"
    elector = LeaderElector(
        api, args.lease_namespace, LEASE_NAME, identity,
        duration_s=args.lease_duration, renew_deadline_s=args.lease_duration * 2 / 3,
    )  # fmt: skip
    if not elector.wait_until_leader(run.stop):
        return None
    metrics.leader.set(1)
    lost = functools.partial(run.fail, "lost the leader lease", at_once=True)
    threading.Thread(target=elector.keep_leading, args=(run.stop, lost), daemon=True).start()
    return elector


def _run_kopf(api: KubeApi, args: argparse.Namespace, metrics: OperatorMetrics, run: Run) -> None:
    """kopf in this (non-main) thread: it logs that it ignores OS signals, which are ours."""
    import kopf

    from tandem.operator.handlers import build_registry
    from tandem.operator.reconcile import Reconciler

    registry = build_registry(Reconciler(api), metrics, args.interval)
    try:
        kopf.run(
            registry=registry, standalone=True, stop_flag=run.stop,
            clusterwide=args.all_namespaces, namespaces=args.namespace,
        )  # fmt: skip
    except BaseException as exc:  # any end of kopf ends the process
        run.fail(f"kopf failed: {exc!r}")
        return
    if not run.stop.is_set():
        run.fail("kopf stopped on its own")


def exit_process(code: int) -> None:
    """Exit now, whatever threads are left (kopf's executor may hold a hung handler)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
