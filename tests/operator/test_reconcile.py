"""The reconcile against an in-memory API: apply, idempotence, prune, invalid specs,
add-on APIs a cluster may lack, workloads held for the model cache, and warnings."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from tandem.operator.reconcile import Reconciler
from tandem.operator.render import render
from tests.operator.crd_schema import example
from tests.operator.fake_api import FakeApi

NOW = "2026-11-21T10:00:00Z"
JOBS = yaml.safe_load((Path(__file__).parent / "fixtures" / "jobs.yaml").read_text())
SERVING = ("Deployment/", "HorizontalPodAutoscaler/")


def reconciler(api: FakeApi) -> Reconciler:
    return Reconciler(api, now=lambda: NOW)


def keys(objects):
    return sorted(f"{o['kind']}/{o['metadata']['name']}" for o in objects)


def finish_downloads(api: FakeApi, state: str = "complete") -> None:
    """What the Job controller writes once each download Job finished."""
    for (kind, _, _), obj in api.objects.items():
        if kind == "Job":
            obj["status"] = copy.deepcopy(JOBS[state]["status"])


def settled(api: FakeApi, llmd: dict) -> Reconciler:
    """Reconcile, let the model download complete, and reconcile again."""
    run = reconciler(api)
    run.reconcile(llmd)
    finish_downloads(api)
    run.reconcile(llmd)
    return run


def test_first_reconcile_applies_every_child_and_writes_status():
    api, llmd = FakeApi(), example("minimal")
    outcome = reconciler(api).reconcile(llmd)
    assert sorted(outcome.applied) == keys(render(llmd))
    assert outcome.pruned == outcome.held == [] and outcome.spec_error is None
    assert api.kinds("Deployment") == ["llama-decode", "llama-prefill", "llama-router"]
    status = api.statuses[-1]
    assert status["phase"] == "Progressing"  # Deployments exist, no pod is ready yet
    assert status["routerURL"] == "http://llama-router.default.svc:8000"
    assert "modelCache" not in status
    assert "ModelCached" not in {c["type"] for c in status["conditions"]}


def test_the_workloads_wait_for_the_model_cache():
    api, llmd = FakeApi(), example("full")
    first = reconciler(api).reconcile(llmd)
    serving = [key for key in keys(render(llmd)) if key.startswith(SERVING)]
    assert sorted(first.held) == serving and len(serving) == 6
    assert sorted(first.applied) == sorted(set(keys(render(llmd))) - set(serving))
    assert api.kinds("Deployment") == [] and len(api.kinds("Job")) == 1
    status = api.statuses[-1]
    assert status["phase"] == "Pending"
    assert status["modelCache"]["jobName"] == api.kinds("Job")[0]
    assert not [call for call in api.listed if call.startswith("Pod ")]  # no failed attempt
    finish_downloads(api)
    second = reconciler(api).reconcile(llmd)
    assert sorted(second.applied) == keys(render(llmd)) and second.held == []
    assert api.kinds("Deployment") == ["qwen-decode", "qwen-prefill", "qwen-router"]
    cached = next(c for c in api.statuses[-1]["conditions"] if c["type"] == "ModelCached")
    assert cached["status"] == "True"


def test_a_failed_download_holds_the_workloads_and_warns_once():
    api, llmd = FakeApi(), example("full")
    run = reconciler(api)
    run.reconcile(llmd)
    finish_downloads(api, "failed")
    job = api.kinds("Job")[0]
    for pod in JOBS["failed_pods"]:
        pod = copy.deepcopy(pod)
        pod["metadata"]["labels"]["batch.kubernetes.io/job-name"] = job
        api.objects[("Pod", "inference", pod["metadata"]["name"])] = pod
    outcome = run.reconcile(llmd)
    assert outcome.held and api.kinds("Deployment") == []
    assert f"Pod batch.kubernetes.io/job-name={job}" in api.listed
    status = api.statuses[-1]
    assert status["phase"] == "Degraded"
    cached = next(c for c in status["conditions"] if c["type"] == "ModelCached")
    assert "GatedRepoError: 401" in cached["message"]
    assert api.warnings == [("Warning", "ModelDownloadFailed", cached["message"])]
    reconciler(api).reconcile(llmd)  # a restarted operator reads the status: no repeat
    assert len(api.warnings) == 1


def test_a_new_revision_keeps_the_running_workloads_until_its_download_completes():
    api, llmd = FakeApi(), example("full")
    settled(api, llmd)
    (old_job,) = api.kinds("Job")
    serving = copy.deepcopy(api.objects[("Deployment", "inference", "qwen-decode")])
    llmd["spec"]["model"]["source"]["huggingFace"]["revision"] = "v2"
    outcome = reconciler(api).reconcile(llmd)
    assert outcome.pruned == [f"Job/{old_job}"]  # its pods go; the claim's folder stays
    assert api.kinds("Job") != [old_job] and len(api.kinds("PersistentVolumeClaim")) == 1
    assert api.objects[("Deployment", "inference", "qwen-decode")] == serving
    finish_downloads(api)
    reconciler(api).reconcile(llmd)
    template = api.objects[("Deployment", "inference", "qwen-decode")]["spec"]["template"]
    assert template != serving["spec"]["template"]


def test_relaxed_hardening_is_reported_once():
    api, llmd = FakeApi(), example("minimal")
    llmd["spec"]["decode"] = {"podTemplate": {"securityOverrides": {"runAsRoot": True}}}
    run = reconciler(api)
    run.reconcile(llmd)
    run.reconcile(llmd)
    relaxed = next(c for c in api.statuses[-1]["conditions"] if c["type"] == "HardeningRelaxed")
    assert relaxed["status"] == "True" and relaxed["message"].endswith("decode: runAsRoot")
    assert api.warnings == [("Warning", "HardeningRelaxed", relaxed["message"])]


def test_reconcile_is_idempotent():
    api, llmd = FakeApi(), example("full")
    first = reconciler(api).reconcile(llmd)
    stored, events = copy.deepcopy(api.objects), list(api.events)
    second = reconciler(api).reconcile(llmd)
    assert second.applied == first.applied and second.pruned == []
    assert api.objects == stored
    assert api.events == events  # nothing new to say


def test_each_generation_brought_about_is_one_normal_event():
    api, llmd = FakeApi(), example("minimal")
    llmd["metadata"]["generation"] = 1
    reconciler(api).reconcile(llmd)
    reconciler(api).reconcile(llmd)  # a resync: the status already says generation 1
    llmd["metadata"]["generation"] = 2
    llmd["spec"]["prefill"] = {"replicas": 0}
    reconciler(api).reconcile(llmd)
    assert [(kind, reason) for kind, reason, _ in api.events] == [("Normal", "Reconciled")] * 2
    assert api.events[0][2] == "generation 1: applied 14 objects"
    assert api.events[1][2].startswith("generation 2: applied 11 objects, deleted ")
    assert "Deployment/llama-prefill" in api.events[1][2]


def test_children_no_longer_rendered_are_pruned():
    api, llmd = FakeApi(), example("full")
    settled(api, llmd)
    claim, job = api.kinds("PersistentVolumeClaim")[0], api.kinds("Job")[0]
    del llmd["spec"]["autoscaling"]
    del llmd["spec"]["monitoring"]
    del llmd["spec"]["model"]["cache"]
    llmd["spec"]["prefill"]["replicas"] = 0
    outcome = reconciler(api).reconcile(llmd)
    assert sorted(outcome.pruned) == sorted([
        "Deployment/qwen-prefill", "Service/qwen-prefill", "PodDisruptionBudget/qwen-prefill",
        "HorizontalPodAutoscaler/qwen-prefill", "HorizontalPodAutoscaler/qwen-decode",
        "HorizontalPodAutoscaler/qwen-router", "PodMonitor/qwen",
        f"PersistentVolumeClaim/{claim}", f"Job/{job}",
    ])  # fmt: skip
    assert api.kinds("HorizontalPodAutoscaler") == []
    assert api.objects[("Deployment", "inference", "qwen-decode")]["spec"]["replicas"] == 4


def test_prune_spares_objects_controlled_by_someone_else():
    api, llmd = FakeApi(), example("full")
    settled(api, llmd)
    stranger = copy.deepcopy(api.objects[("HorizontalPodAutoscaler", "inference", "qwen-decode")])
    stranger["metadata"]["name"] = "qwen-hand-made"
    stranger["metadata"]["ownerReferences"][0]["uid"] = "another-owner"
    api.objects[("HorizontalPodAutoscaler", "inference", "qwen-hand-made")] = stranger
    outcome = reconciler(api).reconcile(llmd)
    assert "HorizontalPodAutoscaler/qwen-hand-made" not in outcome.pruned
    assert "qwen-hand-made" in api.kinds("HorizontalPodAutoscaler")


def test_invalid_spec_changes_no_child_and_warns_once():
    api, llmd = FakeApi(), example("full")
    run = settled(api, llmd)
    api.objects[("Deployment", "inference", "qwen-decode")]["status"] = {"replicas": 4}
    stored = copy.deepcopy(api.objects)
    llmd["spec"]["decode"]["replicas"] = -3
    outcome = run.reconcile(llmd)
    assert outcome.spec_error == "spec.decode.replicas: must be at least 1, got -3"
    assert outcome.applied == [] and outcome.pruned == []
    assert api.objects == stored
    assert api.warnings == [("Warning", "InvalidSpec", outcome.spec_error)]
    status = api.statuses[-1]
    assert status["phase"] == "Invalid"
    spec_valid = next(c for c in status["conditions"] if c["type"] == "SpecValid")
    assert (spec_valid["status"], spec_valid["message"]) == ("False", outcome.spec_error)
    assert status["decode"]["replicas"] == 4  # observed from the Deployment still there
    reconciler(api).reconcile(llmd)  # a fresh operator (restart) reads the status: no repeat
    assert len(api.warnings) == 1


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
    assert [reason for _, reason, _ in api.warnings] == ["MissingAPI"]
    finish_downloads(api)
    run = reconciler(api)
    run.reconcile(llmd)
    run.reconcile(llmd)
    assert api.kinds("Deployment")
    assert len(api.warnings) == 2  # once per operator process, not once per resync


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


def test_the_planners_status_survives_every_reconcile():
    """The SLO planner applies `status.planner` as a manager of its own; the operator's
    status apply never names it, so server-side apply keeps it, through a valid spec and an
    invalid one."""
    api, llmd = FakeApi(), example("minimal")
    llmd["spec"]["slo"] = {"ttftMs": 800, "tpotMs": 60, "decode": {"maxReplicas": 8}}
    run = reconciler(api)
    run.reconcile(llmd)
    planner = {"decode": {"current": 1, "desired": 3}, "predictedAttainment": 0.93,
               "reason": "ttft p90 over target at 1 decode pod"}  # fmt: skip
    api.apply_status(llmd, {"planner": planner}, manager="tandem-planner")
    run.reconcile(llmd)
    llmd["spec"]["slo"]["tpotMs"] = 0
    assert run.reconcile(llmd).spec_error is not None
    assert api.status["planner"] == planner and api.status["phase"] == "Invalid"
    assert all("planner" not in applied for applied in api.statuses)
