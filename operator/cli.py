"""`tandem operator`: reconcile LLMDeployments (in one namespace or all), or `--render FILE`
to print the children of a resource offline, like `helm template`."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import threading

LEASE_NAME = "tandem-operator"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("--namespace", action="append", default=[], help="watch only these")
    scope.add_argument("--all-namespaces", action="store_true", help="watch every namespace")
    parser.add_argument("--render", metavar="FILE", help="print the children of FILE and exit")
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between resyncs")
    parser.add_argument(
        "--leader-election", action=argparse.BooleanOptionalAction, default=True,
        help="hold a Lease so that only one replica reconciles",
    )  # fmt: skip
    parser.add_argument(
        "--lease-namespace", default=os.environ.get("POD_NAMESPACE", "default"),
        help="namespace of the leader Lease (default: $POD_NAMESPACE)",
    )  # fmt: skip
    parser.add_argument("--probe-port", type=int, default=8080, help="/metrics and /healthz")
    parser.add_argument("--log-level", default="info")


def run(args: argparse.Namespace) -> None:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    if args.render:
        sys.exit(render_file(args.render))
    if not args.namespace and not args.all_namespaces:
        sys.exit("tandem operator: give --namespace NS (repeatable) or --all-namespaces")
    sys.exit(operate(args))


def render_file(path: str) -> int:
    import yaml

    from tandem.operator.manifest import dump
    from tandem.operator.render import render

    with open(path) as f:
        llmd = yaml.safe_load(f)
    try:
        objects = render(llmd)
    except ValueError as exc:
        print(f"{path}: {exc}", file=sys.stderr)
        return 1
    print(dump(objects), end="")
    return 0


def operate(args: argparse.Namespace) -> int:
    """Run until stopped; 1 when leadership was lost (the pod restarts as a standby)."""
    import kopf
    from prometheus_client import CollectorRegistry

    from tandem.operator.handlers import build_registry
    from tandem.operator.kube import KubeApi
    from tandem.operator.leader import LeaderElector
    from tandem.operator.metrics import OperatorMetrics, serve_probes
    from tandem.operator.reconcile import Reconciler

    metrics = OperatorMetrics(CollectorRegistry())
    serve_probes(metrics.registry, "0.0.0.0", args.probe_port)
    api = KubeApi.from_environment()
    stop, lost = threading.Event(), threading.Event()
    if args.leader_election:
        identity = f"{os.environ.get('POD_NAME') or socket.gethostname()}_{os.getpid()}"
        elector = LeaderElector(api, args.lease_namespace, LEASE_NAME, identity)
        if not elector.wait_until_leader(stop):
            return 0
        metrics.leader.set(1)

        def on_lost() -> None:
            lost.set()
            stop.set()

        threading.Thread(target=elector.keep_leading, args=(stop, on_lost), daemon=True).start()
    registry = build_registry(Reconciler(api), metrics, args.interval)
    kopf.run(
        registry=registry, standalone=True, stop_flag=stop,
        clusterwide=args.all_namespaces, namespaces=args.namespace,
    )  # fmt: skip
    return 1 if lost.is_set() else 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tandem.operator")
    add_arguments(parser)
    run(parser.parse_args(argv))
