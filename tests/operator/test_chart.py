"""The Helm chart through helm-python-sdk: lint, render with default and full values,
strict validation, RBAC equal to what the operator uses, the dashboards as ConfigMaps and
the rules as a PrometheusRule (their queries are checked by a real Prometheus in
tests/router/test_prometheus.py)."""

from __future__ import annotations

import sys

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version
from prometheus_client import CollectorRegistry

from tandem.engine.telemetry.metrics import NodeMetrics
from tandem.operator.kinds import permissions
from tandem.operator.metrics import OperatorMetrics
from tandem.router.metrics import RouterMetrics
from tests.design import DESIGN_METRICS
from tests.operator.crd_schema import ROOT

CHART = ROOT / "charts" / "tandem"
FULL_VALUES = {
    "replicas": 2,
    "watchNamespaces": ["inference", "staging"],
    "image": {"tag": "0.1.1"},
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "ops", "operator": "Exists", "effect": "NoSchedule"}],
    "metrics": {
        "podMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
        "prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}},
    },
    "dashboards": {"namespace": "monitoring"},
}
VALUES = {"default": None, "full": FULL_VALUES}


def rendered(values):
    chart = helm.Chart.load(str(CHART))
    manifests = chart.render(values, name="tandem", namespace="tandem-system", is_install=True)
    return [doc for name, text in sorted(manifests.items()) if name.endswith(".yaml")
            for doc in yaml.safe_load_all(text) if doc]  # fmt: skip


@pytest.mark.parametrize("values", VALUES.values(), ids=VALUES.keys())
def test_lint_is_clean(values):
    report = helm.lint(str(CHART), values, strict=True, kube_version="v1.30.0")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("version", ["1.30.0", f"{latest_version()}.0"])
@pytest.mark.parametrize("values", VALUES.values(), ids=VALUES.keys())
def test_rendered_objects_are_valid(values, version):
    kinds = []
    for obj in rendered(values):
        kinds.append(obj["kind"])
        if obj["kind"] not in ("PodMonitor", "PrometheusRule"):  # CRDs it has no schema for
            kubernetes_validate.validate(obj, version, strict=True)
    assert {"Deployment", "ServiceAccount", "ConfigMap", "RoleBinding"} <= set(kinds)


def test_the_prometheus_rule_holds_the_rules_file():
    (rule,) = [o for o in rendered(FULL_VALUES) if o["kind"] == "PrometheusRule"]
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    assert rule["spec"] == yaml.safe_load((CHART / "rules" / "tandem.rules.yaml").read_text())
    assert not [o for o in rendered(None) if o["kind"] == "PrometheusRule"]


def test_the_crd_is_in_the_chart():
    (crd,) = helm.Chart.load(str(CHART)).crds
    assert yaml.safe_load(crd["data"]) == yaml.safe_load(
        (ROOT / "crds" / "llmdeployment.yaml").read_text()
    )


def _rules(objects, kinds):
    granted = set()
    for obj in objects:
        if obj["kind"] in kinds:
            for rule in obj["rules"]:
                assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"]
                granted |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"]
                            for v in rule["verbs"]}  # fmt: skip
    return granted


def test_cluster_wide_rbac_is_exactly_what_the_operator_uses():
    objects = rendered(None)
    assert _rules(objects, {"ClusterRole", "Role"}) == permissions()
    (operator,) = [o for o in objects if o["kind"] == "Deployment"]
    assert "--all-namespaces" in operator["spec"]["template"]["spec"]["containers"][0]["args"]


def test_namespaced_mode_grants_only_the_watched_namespaces():
    objects = rendered(FULL_VALUES)
    assert not any(o["kind"] in ("ClusterRole", "ClusterRoleBinding") for o in objects)
    for namespace in ("inference", "staging"):
        in_namespace = [o for o in objects if o["metadata"].get("namespace") == namespace]
        assert _rules(in_namespace, {"Role"}) == permissions() - {
            p for p in permissions() if p[1] == "leases"
        }  # fmt: skip
    leases = [
        o for o in objects if o["kind"] == "Role" and o["metadata"]["name"].endswith("leader")
    ]
    assert leases[0]["metadata"]["namespace"] == "tandem-system"
    (operator,) = [o for o in objects if o["kind"] == "Deployment"]
    args = operator["spec"]["template"]["spec"]["containers"][0]["args"]
    assert {"--namespace=inference", "--namespace=staging"} <= set(args)


def test_operator_pod_is_hardened_and_probed():
    (operator,) = [o for o in rendered(None) if o["kind"] == "Deployment"]
    container = operator["spec"]["template"]["spec"]["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert operator["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def exported_metric_names() -> set[str]:
    """Sample names of every collector the node, router and operator register (the router
    repeats some node names, so each gets its own registry)."""
    registries = [
        NodeMetrics(CollectorRegistry(), "m", "decode", "p").registry,
        RouterMetrics(CollectorRegistry(), "m", "p").registry,
        OperatorMetrics(CollectorRegistry()).registry,
    ]
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}
    names = set()
    for registry in registries:
        for family in registry.collect():
            names |= {family.name + s for s in suffixes.get(family.type, [""])}
    return names


def test_dashboards_are_configmaps_for_the_grafana_sidecar():
    objects = [o for o in rendered(FULL_VALUES) if o["kind"] == "ConfigMap"]
    assert sorted(o["metadata"]["name"] for o in objects) == [
        "tandem-dashboard-disaggregation", "tandem-dashboard-operator", "tandem-dashboard-overview"
    ]  # fmt: skip
    for obj in objects:
        assert obj["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert obj["metadata"]["namespace"] == "monitoring"


# Every dashboard expression is evaluated by a real Prometheus: tests/router/test_prometheus.py


def test_design_metrics_are_all_exported():
    exported = exported_metric_names()
    missing = [m for m in DESIGN_METRICS if m not in exported and f"{m}_bucket" not in exported]
    assert missing == []


def test_committed_dashboards_equal_the_generator():
    sys.path.insert(0, str(ROOT / "charts" / "tools"))
    try:
        import dashboards as generator
    finally:
        sys.path.pop(0)
    for name, text in generator.render_all().items():
        assert (CHART / "dashboards" / name).read_text() == text, name
    # every row, with the question it answers, is listed in the docs
    assert generator.markdown() in (ROOT / "docs" / "kubernetes.md").read_text()
