"""The e2e suite's cluster: a control plane started here from $TANDEM_KUBE_BIN (with a real
node beside it where the machine has what a node needs, `node.py`), else the cluster a
kubeconfig names ($KUBECONFIG or ~/.kube/config), else every test is skipped with the
reason. Either way the CRD and the chart's RBAC are installed once, in namespaces of the
session's own (deleted at the end). On the node, `served` (per module) is the user's
journey's start: the chart installed with Helm and one LLMDeployment serving SmolLM2;
`ready` waits for it to be Ready."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client, config

from tandem.operator.kube import KubeApi
from tests.assets import smollm2
from tests.operator.e2e.cluster import Install, OperatorProc, delete_namespace, install
from tests.operator.e2e.control_plane import ControlPlane, kube_bin
from tests.operator.e2e.helpers import create, wait_condition
from tests.operator.e2e.journey import (
    MODEL_FOLDER,
    Served,
    chart_image,
    helm_install,
    helm_uninstall,
    llm_deployment,
    model_volume,
)
from tests.operator.e2e.node import NODE_IP, STATE, HostNetwork, Node, missing
from tests.operator.e2e.pairing import pod_log

KUBECONFIG = Path(os.environ.get("KUBECONFIG", Path.home() / ".kube" / "config"))
NO_CLUSTER = (
    "no Kubernetes API server: set TANDEM_KUBE_BIN to a folder holding etcd, kube-apiserver "
    f"and kube-controller-manager, or point KUBECONFIG at a cluster (no file at {KUBECONFIG})"
)


@dataclass
class Cluster:
    api: KubeApi  # the administrator's
    server: str
    ca: Path
    plane: ControlPlane | None  # None: someone else's cluster, which the tests cannot restart
    node: Node | None = None  # the node started here, None where it cannot run
    no_node: str = "a cluster of someone else's: the suite starts no node in it"


def admin_api(kubeconfig_path: Path) -> tuple[KubeApi, str, Path | None]:
    configuration = client.Configuration()
    config.load_kube_config(str(kubeconfig_path), client_configuration=configuration)
    ca = Path(configuration.ssl_ca_cert) if configuration.ssl_ca_cert else None
    return KubeApi(client.ApiClient(configuration)), configuration.host, ca


@pytest.fixture(scope="session")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    bin_dir = kube_bin()
    if bin_dir is not None:
        no_node = missing(bin_dir)
        net = HostNetwork().start() if no_node is None else None
        host = NODE_IP if net else "127.0.0.1"
        plane = node = None
        try:
            plane = ControlPlane(bin_dir, tmp_path_factory.mktemp("control-plane"), host)
            plane.start()
            if net:
                node = Node(plane, tmp_path_factory.mktemp("node")).start()
            api, server, _ = admin_api(plane.dir / "admin.kubeconfig")
            yield Cluster(api, server, plane.ca, plane, node, no_node or "")
        finally:
            for part in (node, plane, net):
                if part is not None:
                    part.stop()
    elif KUBECONFIG.is_file():
        api, server, ca = admin_api(KUBECONFIG)
        yield Cluster(api, server, ca, None)
    else:
        pytest.skip(NO_CLUSTER)


@pytest.fixture(scope="session")
def setup(cluster, tmp_path_factory) -> Iterator[Install]:
    workdir = tmp_path_factory.mktemp("install")
    done = install(cluster.api, cluster.server, cluster.ca, workdir, uuid.uuid4().hex[:6])
    try:
        yield done
    finally:
        for namespace in (done.watched, done.operator_namespace):
            delete_namespace(cluster.api, namespace)


@pytest.fixture(scope="session")
def operator_logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("operator-logs")


@pytest.fixture
def start_operator(setup, operator_logs):
    """Start `tandem operator` processes (ready: /healthz 200); all stopped after the test."""
    started: list[OperatorProc] = []

    def start(pod: str, *extra: str, kubeconfig: Path | None = None, wait: bool = True):
        proc = OperatorProc(operator_logs, setup, pod, kubeconfig, *extra)
        started.append(proc.start())
        if wait:
            proc.wait_ready(timeout=300)
        return proc

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture(scope="module")
def served(cluster) -> Served:
    if cluster.node is None:
        pytest.skip(f"no node: {cluster.no_node}")
    image = chart_image()
    why = cluster.node.load_image(image)
    if why:
        pytest.skip(why)
    smollm2(STATE / "models" / MODEL_FOLDER)
    suffix = uuid.uuid4().hex[:6]
    operator_ns, namespace = f"tandem-op-{suffix}", f"tandem-app-{suffix}"
    kubeconfig = cluster.plane.dir / "admin.kubeconfig"
    restricted = {f"pod-security.kubernetes.io/{m}": "restricted" for m in ("enforce", "warn")}
    cluster.api._call("POST", "/api/v1/namespaces", body={
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": namespace, "labels": restricted}})  # fmt: skip
    pv = model_volume(cluster.api, namespace, STATE / "models")
    helm_install(kubeconfig, operator_ns, namespace, image)
    served = Served(cluster.api, operator_ns, namespace, "smol", image)
    create(cluster.api, llm_deployment(served.name, namespace, image))
    yield served
    helm_uninstall(kubeconfig, operator_ns)
    for ns in (namespace, operator_ns):
        delete_namespace(cluster.api, ns)
    cluster.api._call("DELETE", f"/api/v1/persistentvolumes/{pv}")


@pytest.fixture(scope="module")
def ready(served) -> Served:
    wait_condition(served.api, {"metadata": {"namespace": served.namespace,
                                             "name": served.name}}, "Ready", "True")  # fmt: skip
    return served


LOG_TAIL_LINES = 60


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test that used the deployment gets the tail of each of its pods' logs as a
    report section, so a CI log says what the pods did (read while they still live)."""
    report = yield
    served = item.funcargs.get("ready") or item.funcargs.get("served")
    if report.when == "call" and report.failed and served is not None:
        report.sections.append(("pod logs", _pod_logs(served)))
    return report


def _pod_logs(served) -> str:
    parts = []
    for role in ("router", "prefill", "decode", "planner"):
        for pod in served.pods(role):
            name = pod["metadata"]["name"]
            lines = pod_log(served.api, served.namespace, name).splitlines()[-LOG_TAIL_LINES:]
            parts.append(f"--- {name} ({role}), last {len(lines)} lines\n" + "\n".join(lines))
    return "\n".join(parts)
