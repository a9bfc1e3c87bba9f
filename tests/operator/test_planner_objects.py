"""What `spec.slo` renders: the planner's Deployment and its least rights (which the
operator holds, to be allowed to grant them), the planned pools' Deployments without a
replica count, a planned prefill pool at 0 replicas, the model folder read-only in the
planner's pod, and the PodMonitor scraping it."""

from __future__ import annotations

import kubernetes_validate
import pytest
from kubernetes_validate.utils import latest_version

from tandem.operator.kinds import PLANNER_PERMISSIONS, permissions
from tandem.operator.names import ROLE_LABEL
from tandem.operator.render import render
from tests.operator.crd_schema import example
from tests.operator.pod_security import restricted_violations
from tests.operator.test_render import by_key, scraped_port

SLO = {"ttftMs": 800, "tpotMs": 60, "decode": {"maxReplicas": 8}}


def with_slo(name: str = "minimal", **slo) -> dict:
    llmd = example(name)
    llmd["spec"]["slo"] = SLO | slo
    return llmd


def planner(llmd: dict) -> dict:
    return by_key(render(llmd))[("Deployment", f"{llmd['metadata']['name']}-planner")]


def test_without_slo_no_planner_is_rendered():
    for name in ("minimal", "full", "kv-tiers"):
        assert not [o for o in render(example(name)) if "planner" in o["metadata"]["name"]]


def test_the_slo_example_renders_the_planner_and_its_identity():
    objects = by_key(render(example("slo")))
    planner_keys = sorted(key for key in objects if key[1] == "llama-planner")
    assert planner_keys == [
        ("Deployment", "llama-planner"), ("NetworkPolicy", "llama-planner"),
        ("Role", "llama-planner"), ("RoleBinding", "llama-planner"),
        ("ServiceAccount", "llama-planner"),
    ]  # fmt: skip
    binding = objects[("RoleBinding", "llama-planner")]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "llama-planner", "namespace": "inference"}
    ]
    assert binding["roleRef"]["name"] == "llama-planner"
    for key in planner_keys:
        assert objects[key]["metadata"]["labels"][ROLE_LABEL] == "planner"
        assert objects[key]["metadata"]["ownerReferences"][0]["kind"] == "LLMDeployment"


def test_the_planner_deployment():
    deployment = planner(example("slo"))
    spec = deployment["spec"]
    assert (spec["replicas"], spec["strategy"]) == (1, {"type": "Recreate"})
    pod = spec["template"]["spec"]
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    assert pod["serviceAccountName"] == "llama-planner"
    (container,) = pod["containers"]
    assert container["image"] == "ghcr.io/tandem-serving/tandem:0.1.0"
    assert container["command"] == ["tandem"]
    assert container["args"] == ["planner", "--llmdeployment", "llama", "--namespace", "inference"]
    assert container["ports"] == [{"name": "metrics", "containerPort": 9090, "protocol": "TCP"}]
    assert container["resources"] == {
        "requests": {"cpu": "100m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}
    }  # fmt: skip
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "metrics"}
    router = by_key(render(example("slo")))[("Deployment", "llama-router")]["spec"]["template"]
    assert pod["securityContext"] == router["spec"]["securityContext"]
    assert container["securityContext"] == router["spec"]["containers"][0]["securityContext"]


def test_the_planner_has_exactly_its_rights():
    role = by_key(render(example("slo")))[("Role", "llama-planner")]
    assert role["rules"] == [
        {"apiGroups": ["tandem.dev"], "resources": ["llmdeployments"],
         "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["tandem.dev"], "resources": ["llmdeployments/status"],
         "verbs": ["get", "patch", "update"], "resourceNames": ["llama"]},
        {"apiGroups": ["apps"], "resources": ["deployments", "deployments/scale"],
         "verbs": ["get"], "resourceNames": ["llama-prefill", "llama-decode"]},
        {"apiGroups": ["apps"], "resources": ["deployments/scale"], "verbs": ["patch", "update"],
         "resourceNames": ["llama-prefill", "llama-decode"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
        {"apiGroups": ["", "events.k8s.io"], "resources": ["events"],
         "verbs": ["create", "patch"]},
    ]  # fmt: skip


def test_the_planner_scales_only_the_pools_it_plans():
    role = by_key(render(with_slo()))[("Role", "llama-planner")]
    (scale,) = [r for r in role["rules"] if "patch" in r["verbs"] and r["apiGroups"] == ["apps"]]
    assert scale["resourceNames"] == ["llama-decode"]


def test_the_operator_holds_every_right_it_grants_the_planner():
    """RBAC escalation prevention: a Role is created only by someone who holds its rules."""
    (role,) = [o for o in render(example("slo")) if o["kind"] == "Role" and "planner" in
               o["metadata"]["name"]]  # fmt: skip
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
               for r in rule["resources"] for v in rule["verbs"]}  # fmt: skip
    assert granted == PLANNER_PERMISSIONS <= permissions()


def test_planned_pools_leave_their_count_to_the_planner():
    objects = by_key(render(with_slo()))
    assert "replicas" not in objects[("Deployment", "llama-decode")]["spec"]
    assert objects[("Deployment", "llama-prefill")]["spec"]["replicas"] == 1  # not planned
    assert objects[("Deployment", "llama-router")]["spec"]["replicas"] == 1


def test_a_planned_prefill_pool_is_rendered_at_zero_replicas():
    llmd = with_slo(prefill={"maxReplicas": 4})
    llmd["spec"]["prefill"] = {"replicas": 0}
    objects = by_key(render(llmd))
    assert "replicas" not in objects[("Deployment", "llama-prefill")]["spec"]
    assert ("Service", "llama-prefill") in objects
    assert "prefill.json" in objects[("ConfigMap", "llama-config")]["data"]
    del llmd["spec"]["slo"]["prefill"]  # decode alone planned: no prefill pool
    assert ("Deployment", "llama-prefill") not in by_key(render(llmd))


@pytest.mark.parametrize(
    ("source", "volume"),
    [
        ({"pvc": {"claimName": "models", "path": "m"}},
         {"persistentVolumeClaim": {"claimName": "models", "readOnly": True}}),
        ({"hostPath": {"path": "/srv/models/m"}},
         {"hostPath": {"path": "/srv/models/m", "type": "Directory"}}),
        ({"huggingFace": {"repo": "org/m"}}, None),
    ],
)  # fmt: skip
def test_the_model_folder_is_mounted_read_only_where_the_nodes_have_it(source, volume):
    llmd = with_slo()
    llmd["spec"]["model"]["source"] = source
    objects = by_key(render(llmd))
    pod = planner(llmd)["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    found = {v["name"]: v for v in pod["volumes"]}
    decode = objects[("Deployment", "llama-decode")]["spec"]["template"]["spec"]
    decode_mount = next(m for m in decode["containers"][0]["volumeMounts"] if m["name"] == "model")
    if volume is None:  # each node downloads its own copy: nothing to share
        assert "model" not in found and "model" not in mounts
        return
    assert found["model"] == {"name": "model", **volume}
    assert mounts["model"] == {"name": "model", "mountPath": decode_mount["mountPath"],
                               "readOnly": True}  # fmt: skip


def test_the_model_cache_claim_is_mounted_too():
    llmd = with_slo("full")
    del llmd["spec"]["autoscaling"]["decode"]
    pod = planner(llmd)["spec"]["template"]["spec"]
    (claim,) = [v for v in pod["volumes"] if v["name"] == "model"]
    assert claim["persistentVolumeClaim"]["claimName"].startswith("qwen-cache-")


@pytest.mark.parametrize("version", ["1.30.0", f"{latest_version()}.0"])
def test_every_object_is_valid_kubernetes(version):
    for obj in render(example("slo")):
        if obj["kind"] != "PodMonitor":
            kubernetes_validate.validate(obj, version, strict=True)


def test_the_planner_pod_is_restricted():
    assert restricted_violations(planner(example("slo"))["spec"]["template"]["spec"]) == []


def test_the_pod_monitor_scrapes_the_planner_on_its_metrics_port():
    objects = render(example("slo"))
    (monitor,) = [o for o in objects if o["kind"] == "PodMonitor"]
    template = planner(example("slo"))["spec"]["template"]
    labels = template["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    ports = {p["name"] for p in template["spec"]["containers"][0]["ports"]}
    assert scraped_port(monitor["spec"]["podMetricsEndpoints"], labels, ports) == "metrics"


def test_only_the_scrapers_reach_the_planner_and_only_its_metrics_port():
    llmd = example("slo")
    objects = by_key(render(llmd))
    policy = objects[("NetworkPolicy", "llama-planner")]["spec"]
    pod = objects[("Deployment", "llama-planner")]["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= pod.items()
    nodes = objects[("Deployment", "llama-decode")]["spec"]["template"]["metadata"]["labels"]
    assert not policy["podSelector"]["matchLabels"].items() <= nodes.items()
    ((rule),) = policy["ingress"]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": llmd["spec"]["monitoring"]["podMonitor"].get(
            "scraperNamespace", "monitoring")}}}]  # fmt: skip
    assert rule["ports"] == [{"protocol": "TCP", "port": 9090}]
    del llmd["spec"]["monitoring"]
    quiet = by_key(render(llmd))[("NetworkPolicy", "llama-planner")]["spec"]
    assert quiet["ingress"] == [] and quiet["policyTypes"] == ["Ingress"]  # nobody
