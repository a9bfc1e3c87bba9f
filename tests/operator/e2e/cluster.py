"""What the e2e tests do to a cluster as its administrator: apply arbitrary objects, install
the CRD and the chart's own RBAC, mint a ServiceAccount token, and run `tandem operator`
as users do, authenticated only by that token."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import httpx
import yaml

from tandem.operator.kube import ApiError, KubeApi
from tests.disagg.nodes import Proc, metric_value
from tests.operator.crd_schema import ROOT, crd
from tests.operator.e2e.control_plane import kubeconfig

CHART = ROOT / "charts" / "tandem"
RELEASE = "tandem"
# kind -> (plural, namespaced): the kinds the chart and the tests create as administrator
ADMIN_KINDS = {
    "Namespace": ("namespaces", False),
    "CustomResourceDefinition": ("customresourcedefinitions", False),
    "ServiceAccount": ("serviceaccounts", True),
    "ConfigMap": ("configmaps", True),
    "Role": ("roles", True),
    "RoleBinding": ("rolebindings", True),
    "ClusterRole": ("clusterroles", False),
    "ClusterRoleBinding": ("clusterrolebindings", False),
    "PersistentVolume": ("persistentvolumes", False),
    "PersistentVolumeClaim": ("persistentvolumeclaims", True),
}


def object_path(obj: dict[str, Any]) -> str:
    plural, namespaced = ADMIN_KINDS[obj["kind"]]
    version = obj["apiVersion"]
    root = "/api/v1" if version == "v1" else f"/apis/{version}"
    scope = f"/namespaces/{obj['metadata']['namespace']}" if namespaced else ""
    return f"{root}{scope}/{plural}/{obj['metadata']['name']}"


def admin_apply(api: KubeApi, obj: dict[str, Any]) -> dict[str, Any]:
    """Server-side apply as the test's own field manager."""
    query = [("fieldManager", "tandem-e2e"), ("force", "true")]
    return api._call("PATCH", object_path(obj), query, obj, "application/apply-patch+yaml")


def chart_objects(
    operator_namespace: str, watched: list[str], **values: Any
) -> list[dict[str, Any]]:
    """The chart as `helm install` renders it, in namespaced mode (one Role per watched
    namespace: the least privilege the chart offers), with `values` on top."""
    chart = helm.Chart.load(str(CHART))
    values = {"watchNamespaces": watched, "resyncInterval": 2, **values}
    manifests = chart.render(values, name=RELEASE, namespace=operator_namespace, is_install=True)
    return [
        doc
        for name, text in sorted(manifests.items())
        if name.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


@dataclass
class Install:
    """The CRD and the chart's RBAC in a cluster; `token_kubeconfig` authenticates as the
    chart's ServiceAccount and nothing else."""

    api: KubeApi  # the administrator's
    operator_namespace: str
    watched: str  # enforces pod-security "restricted"
    service_account: str
    token_kubeconfig: Path


def install(api: KubeApi, server: str, ca: Path, workdir: Path, suffix: str) -> Install:
    operator_ns, watched = f"tandem-system-{suffix}", f"tandem-e2e-{suffix}"
    admin_apply(api, _namespace(operator_ns, {}))
    enforce = {f"pod-security.kubernetes.io/{m}": "restricted" for m in ("enforce", "warn")}
    admin_apply(api, _namespace(watched, enforce))
    admin_apply(api, crd())
    objects = chart_objects(operator_ns, [watched])
    for obj in objects:
        if obj["kind"] in ADMIN_KINDS:  # not the operator's Deployment: the test runs it
            admin_apply(api, obj)
    (account,) = [o for o in objects if o["kind"] == "ServiceAccount"]
    name = account["metadata"]["name"]
    token = service_account_token(api, operator_ns, name)
    path = kubeconfig(workdir / "operator.kubeconfig", server, ca, token=token)
    return Install(api, operator_ns, watched, name, path)


def service_account_token(api: KubeApi, namespace: str, name: str) -> str:
    """A bound token by TokenRequest, as kubelet projects one into a pod."""
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"expirationSeconds": 7200}}  # fmt: skip
    path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"
    return api._call("POST", path, body=body)["status"]["token"]


def second_identity(setup: Install, workdir: Path, name: str) -> Path:
    """A kubeconfig for another ServiceAccount bound to the chart's own Roles: one the
    tests may delete, revoking its tokens."""
    ns = setup.operator_namespace
    admin_apply(setup.api, {"apiVersion": "v1", "kind": "ServiceAccount",
                            "metadata": {"name": name, "namespace": ns}})  # fmt: skip
    for binding_ns, role in ((setup.watched, RELEASE), (ns, f"{RELEASE}-leader")):
        admin_apply(setup.api, {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": f"{name}-{role}", "namespace": binding_ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}],
        })  # fmt: skip
    token = service_account_token(setup.api, ns, name)
    config = yaml.safe_load(setup.token_kubeconfig.read_text())
    config["users"][0]["user"]["token"] = token
    path = workdir / f"{name}.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


def delete_namespace(api: KubeApi, name: str) -> None:
    try:
        api._call("DELETE", f"/api/v1/namespaces/{name}")
    except ApiError as exc:
        if exc.status != 404:
            raise


def _namespace(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": labels}}  # fmt: skip


class OperatorProc(Proc):
    """`tandem operator` in its own process, as the chart's Deployment runs it; `http_port`
    is its probe port (/healthz, /metrics)."""

    name = "operator"
    ready_path = "/healthz"

    def __init__(
        self, log_dir: Path, setup: Install, pod: str, kubeconfig: Path | None = None, *extra: str
    ) -> None:
        super().__init__(log_dir)
        self.setup, self.pod, self.extra = setup, pod, extra
        self.kubeconfig = kubeconfig or setup.token_kubeconfig

    def command(self) -> list[str]:
        return [
            sys.executable, "-P", "-m", "tandem.cli", "operator",
            "--namespace", self.setup.watched, "--lease-namespace", self.setup.operator_namespace,
            "--interval", "2", "--probe-port", str(self.http_port), "--log-level", "info",
            *self.extra,
        ]  # fmt: skip

    def environment(self) -> dict[str, str]:
        return {"KUBECONFIG": str(self.kubeconfig), "POD_NAME": self.pod,
                "POD_NAMESPACE": self.setup.operator_namespace}  # fmt: skip

    def counter(self, name: str, **labels: str) -> float:
        return metric_value(self.metrics(), name, **labels)

    def healthz(self) -> int | None:
        """/healthz's status code, None while nothing answers."""
        try:
            return httpx.get(f"{self.url}/healthz", timeout=30).status_code
        except httpx.HTTPError:
            return None

    def log(self) -> str:
        return (self.log_dir / f"{self.name}-{self.http_port}.log").read_text()
