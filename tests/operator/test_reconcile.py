"""The reconcile against an in-memory API: apply, idempotence, prune, invalid specs, and
add-on APIs a cluster may lack."""

from __future__ import annotations

import copy

from tandem.operator.reconcile import Reconciler
from tandem.operator.render import render
from tests.operator.crd_schema import example
from tests.operator.fake_api import FakeApi

NOW = "2026-11-21T10:00:00Z"


def reconciler(api: FakeApi) -> Reconciler:
    return Reconciler(api, now=lambda: NOW)


def test_first_reconcile_applies_every_child_and_writes_status():
    api, llmd = FakeApi(), example("full")
    outcome = reconciler(api).reconcile(llmd)
    assert sorted(outcome.applied) == sorted(
        f"{o['kind']}/{o['metadata']['name']}" for o in render(llmd)
    )
    assert outcome.pruned == [] and outcome.spec_error is None
    assert api.kinds("Deployment") == ["qwen-decode", "qwen-prefill", "qwen-router"]
    status = api.statuses[-1]
    assert status["phase"] == "Progressing"  # Deployments exist, no pod is ready yet
    assert status["routerURL"] == "http://qwen-router.inference.svc:443"


def test_reconcile_is_idempotent():
    api, llmd = FakeApi(), example("full")
    first = reconciler(api).reconcile(llmd)
    stored = copy.deepcopy(api.objects)
    second = reconciler(api).reconcile(llmd)
    assert second.applied == first.applied and second.pruned == []
    assert api.objects == stored
    assert api.events == []


def test_children_no_longer_rendered_are_pruned():
    api, llmd = FakeApi(), example("full")
    reconciler(api).reconcile(llmd)
    del llmd["spec"]["autoscaling"]
    del llmd["spec"]["monitoring"]
    llmd["spec"]["prefill"]["replicas"] = 0
    outcome = reconciler(api).reconcile(llmd)
    assert sorted(outcome.pruned) == sorted([
        "Deployment/qwen-prefill", "Service/qwen-prefill", "PodDisruptionBudget/qwen-prefill",
        "HorizontalPodAutoscaler/qwen-prefill", "HorizontalPodAutoscaler/qwen-decode",
        "PodMonitor/qwen",
    ])  # fmt: skip
    assert api.kinds("HorizontalPodAutoscaler") == []
    assert api.objects[("Deployment", "inference", "qwen-decode")]["spec"]["replicas"] == 4


def test_prune_spares_objects_controlled_by_someone_else():
    api, llmd = FakeApi(), example("full")
    reconciler(api).reconcile(llmd)
    stranger = copy.deepcopy(api.objects[("HorizontalPodAutoscaler", "inference", "qwen-decode")])
    stranger["metadata"]["name"] = "qwen-hand-made"
    stranger["metadata"]["ownerReferences"][0]["uid"] = "another-owner"
    api.objects[("HorizontalPodAutoscaler", "inference", "qwen-hand-made")] = stranger
    outcome = reconciler(api).reconcile(llmd)
    assert "HorizontalPodAutoscaler/qwen-hand-made" not in outcome.pruned
    assert "qwen-hand-made" in api.kinds("HorizontalPodAutoscaler")


def test_invalid_spec_changes_no_child_and_warns_once():
    api, llmd = FakeApi(), example("full")
    run = reconciler(api)
    run.reconcile(llmd)
    api.objects[("Deployment", "inference", "qwen-decode")]["status"] = {"replicas": 4}
    stored = copy.deepcopy(api.objects)
    llmd["spec"]["decode"]["replicas"] = -3
    outcome = run.reconcile(llmd)
    assert outcome.spec_error == "spec.decode.replicas: must be at least 1, got -3"
    assert outcome.applied == [] and outcome.pruned == []
    assert api.objects == stored
    assert api.events == [("Warning", "InvalidSpec", outcome.spec_error)]
    status = api.statuses[-1]
    assert status["phase"] == "Invalid"
    spec_valid = next(c for c in status["conditions"] if c["type"] == "SpecValid")
    assert (spec_valid["status"], spec_valid["message"]) == ("False", outcome.spec_error)
    assert status["decode"]["replicas"] == 4  # observed from the Deployment still there
    reconciler(api).reconcile(llmd)  # a fresh operator (restart) reads the status: no repeat
    assert len(api.events) == 1


def test_fixing_the_spec_recovers():
    api, llmd = FakeApi(), example("minimal")
    llmd["spec"]["router"] = {"policy": "fastest"}
    assert reconciler(api).reconcile(llmd).spec_error is not None
    assert api.objects == {}
    llmd["spec"]["router"] = {"policy": "least-load"}
    outcome = reconciler(api).reconcile(llmd)
    assert outcome.spec_error is None and api.kinds("Deployment")
    spec_valid = next(c for c in api.statuses[-1]["conditions"] if c["type"] == "SpecValid")
    assert spec_valid["status"] == "True"


def test_a_cluster_without_prometheus_operator_skips_the_pod_monitor():
    api, llmd = FakeApi(missing_groups=frozenset({"monitoring.coreos.com"})), example("full")
    outcome = reconciler(api).reconcile(llmd)
    assert outcome.skipped == ["PodMonitor/qwen"]
    assert [reason for _, reason, _ in api.events] == ["MissingAPI"]
    assert api.kinds("Deployment")
    run = reconciler(api)
    run.reconcile(llmd)
    run.reconcile(llmd)
    assert len(api.events) == 2  # once per operator process, not once per resync


def test_status_follows_the_deployments():
    api, llmd = FakeApi(), example("minimal")
    reconciler(api).reconcile(llmd)
    for (kind, _, _name), obj in api.objects.items():
        if kind == "Deployment":
            replicas = obj["spec"]["replicas"]
            obj["metadata"]["generation"] = 1
            obj["status"] = {"observedGeneration": 1, "replicas": replicas,
                             "readyReplicas": replicas, "updatedReplicas": replicas}  # fmt: skip
    status = reconciler(api).reconcile(llmd).status
    assert status["phase"] == "Ready"
    assert status["revision"] == api.objects[("Deployment", "default", "llama-decode")]["spec"][
        "template"]["metadata"]["labels"]["tandem.dev/revision"]  # fmt: skip
