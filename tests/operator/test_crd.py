"""The CRD: a valid apiextensions/v1 object, the examples pass its schema, bad resources are
refused the way the API server would refuse them, and its defaults are render()'s."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest
from kubernetes_validate.utils import latest_version

from tandem.operator.render import render
from tests.operator.crd_schema import ROOT, crd, example, schema, validate, with_defaults

VERSIONS = ["1.30.0", f"{latest_version()}.0"]


@pytest.mark.parametrize("version", VERSIONS)
def test_crd_is_a_valid_custom_resource_definition(version):
    kubernetes_validate.validate(crd(), version, strict=True)


def test_crd_names_and_subresources():
    spec = crd()["spec"]
    assert (spec["group"], spec["scope"], spec["names"]["kind"]) == (
        "tandem.dev", "Namespaced", "LLMDeployment"
    )  # fmt: skip
    assert spec["names"]["shortNames"] == ["llmd"]
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert {"Ready", "Router", "Prefill", "Decode", "Age"} <= set(columns)
    status = schema()["properties"]["status"]["properties"]
    for path in columns.values():
        if path.startswith(".status."):
            assert path.split(".")[2].split("[")[0] in status, path


@pytest.mark.parametrize("name", ["minimal", "full", "tensor-parallel", "kv-tiers", "slo"])
def test_examples_pass_the_schema(name):
    assert validate(example(name)) == []


def _edit(path: str, value):
    llmd = example("full")
    *parents, last = path.split(".")
    node = llmd
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return llmd


@pytest.mark.parametrize(
    ("path", "value", "error"),
    [
        ("spec.decode.replicas", -1, "spec.decode.replicas"),
        ("spec.prefill.replicas", -2, "spec.prefill.replicas"),
        ("spec.router.replicas", 0, "spec.router.replicas"),
        ("spec.router.policy", "random", "spec.router.policy"),
        ("spec.model.dtype", "int4", "spec.model.dtype"),
        ("spec.engine.blockSize", 12, "spec.engine.blockSize"),
        ("spec.engine.gpuMemoryUtilization", 0, "spec.engine.gpuMemoryUtilization"),
        ("spec.prefill.tensorParallelSize", 3, "spec.prefill.tensorParallelSize"),
        ("spec.router.service.port", 70000, "spec.router.service.port"),
        ("spec.disaggregation.onPrefillFailure", "retry", "spec.disaggregation"),
        ("spec.model.source.pvc", {"claimName": "models"}, "exactly one of"),
        ("spec.autoscaling.decode.minReplicas", 20, "minReplicas must not exceed"),
        ("spec.decode.gpus", 2, "'gpus' was unexpected"),
        ("spec.decode.podTemplate", {"hostNetwork": True}, "'hostNetwork' was unexpected"),
        ("spec.decode.podTemplate", {"capabilities": ["NET_ADMIN"]}, "podTemplate.capabilities"),
        ("spec.decode.podTemplate", {"containers": [{"name": "x"}]}, "'image' is a required"),
        ("spec.decode.podTemplate", {"securityOverrides": {"root": True}}, "'root' was unexpected"),
        (
            "spec.model.cache",
            {"pvc": {"size": "1Gi", "accessModes": ["ReadWriteOncePod"]}},
            "spec.model.cache.pvc.accessModes",
        ),
        ("spec.autoscaling.router", {"minReplicas": 2}, "'maxReplicas' is a required"),
    ],
)
def test_bad_resources_are_refused(path, value, error):
    errors = validate(_edit(path, value))
    assert any(error in e for e in errors), errors


def test_an_empty_source_is_refused():
    llmd = example("minimal")
    llmd["spec"]["model"]["source"] = {}
    assert validate(llmd) == [
        "spec.model.source: exactly one of pvc, hostPath, huggingFace must be set"
    ]


@pytest.mark.parametrize("name", ["minimal", "full", "tensor-parallel", "kv-tiers", "slo"])
def test_crd_defaults_are_the_operators_defaults(name):
    """The API server fills defaults before the operator reads a resource; a resource the
    server never saw must render the same."""
    llmd = example(name)
    assert render(with_defaults(llmd)) == render(llmd)


def undocumented(node: dict, path: str) -> list[str]:
    """Paths of the properties under `node`, at every depth (inside array items and map
    values too), that `kubectl explain` would show without a description."""
    missing = []
    for key, sub in node.get("properties", {}).items():
        at = f"{path}.{key}"
        if not str(sub.get("description", "")).strip():
            missing.append(at)
        missing += undocumented(sub, at)
    for key, suffix in (("items", "[*]"), ("additionalProperties", ".*")):
        if isinstance(node.get(key), dict):
            missing += undocumented(node[key], path + suffix)
    return missing


def test_kubectl_explain_documents_every_field():
    """Except `metadata`, where Kubernetes refuses anything but name and generateName (a
    structural schema rule) and `kubectl explain` shows ObjectMeta's own documentation."""
    root = schema()
    assert root["description"].strip()
    assert undocumented(root, "llmd") == ["llmd.metadata"]
    assert set(root["properties"]["metadata"]) == {"type", "properties"}
    assert set(root["properties"]["metadata"]["properties"]) <= {"name", "generateName"}


def test_the_description_check_finds_a_nested_gap():
    node = {"properties": {"a": {"description": "A.", "type": "array", "items": {
        "properties": {"b": {"type": "string"}, "c": {"description": " "}}}}}}  # fmt: skip
    assert undocumented(node, "x") == ["x.a[*].b", "x.a[*].c"]


def test_chart_ships_the_same_crd():
    chart_crd = ROOT / "charts" / "tandem" / "crds" / "llmdeployment.yaml"
    assert chart_crd.read_text() == (ROOT / "crds" / "llmdeployment.yaml").read_text()


def test_defaults_fill_nested_blocks():
    filled = with_defaults(copy.deepcopy(example("minimal")))
    assert filled["spec"]["router"]["service"] == {"type": "ClusterIP", "port": 8000}
    assert filled["spec"]["engine"]["blockSize"] == 16
