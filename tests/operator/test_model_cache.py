"""The shared model cache: a claim and a download Job rendered once per model, pods that
mount it read-only, names that change exactly when Kubernetes could not update the object
in place, and the Job's progress read from recorded statuses."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tandem.operator.model_cache import CacheProgress, last_error
from tandem.operator.names import REVISION_LABEL
from tandem.operator.render import render
from tests.operator.crd_schema import example, validate

JOBS = yaml.safe_load((Path(__file__).parent / "fixtures" / "jobs.yaml").read_text())
MODEL = "/models/huggingface/Qwen/Qwen3-32B/9216db5781bf21249d130ec9da846c4624c16137"


def cache_objects(llmd):
    return {o["kind"]: o for o in render(llmd) if o["kind"] in ("PersistentVolumeClaim", "Job")}


def deployments(llmd):
    return [o for o in render(llmd) if o["kind"] == "Deployment"]


def test_a_claim_and_a_job_download_the_model_once():
    objects = cache_objects(example("full"))
    claim, job = objects["PersistentVolumeClaim"]["spec"], objects["Job"]["spec"]
    assert claim == {"accessModes": ["ReadWriteMany"], "storageClassName": "shared-rwx",
                     "resources": {"requests": {"storage": "200Gi"}}}  # fmt: skip
    pod = job["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and job["backoffLimit"] == 4
    (download,) = pod["containers"]
    assert download["args"] == ["Qwen/Qwen3-32B", "9216db5781bf21249d130ec9da846c4624c16137",
                                MODEL]  # fmt: skip
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token",
            "key": "token"}}} in download["env"]  # fmt: skip
    assert download["terminationMessagePolicy"] == "FallbackToLogsOnError"
    claim_name = objects["PersistentVolumeClaim"]["metadata"]["name"]
    assert pod["volumes"][0]["persistentVolumeClaim"] == {"claimName": claim_name}


def test_every_pod_mounts_the_claim_read_only_and_downloads_nothing():
    llmd = example("full")
    claim_name = cache_objects(llmd)["PersistentVolumeClaim"]["metadata"]["name"]
    config = next(o for o in render(llmd) if o["kind"] == "ConfigMap")["data"]
    assert all(f'"model": "{MODEL}"' in text for text in config.values())
    for deployment in deployments(llmd):
        pod = deployment["spec"]["template"]["spec"]
        assert "download" not in [c["name"] for c in pod.get("initContainers", [])]
        model = next(v for v in pod["volumes"] if v["name"] == "model")
        assert model["persistentVolumeClaim"] == {"claimName": claim_name, "readOnly": True}
        mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "model")
        assert mount["readOnly"] is True


def _names(llmd):
    objects = cache_objects(llmd)
    return {kind: obj["metadata"]["name"] for kind, obj in objects.items()}


@pytest.mark.parametrize(
    ("edit", "new_claim", "new_job"),
    [
        (lambda s: s["model"]["source"]["huggingFace"].update(revision="v2"), False, True),
        (lambda s: s.update(image="tandem:next"), False, True),
        (lambda s: s["model"]["cache"]["pvc"].update(size="400Gi"), False, False),
        (lambda s: s["model"]["cache"]["pvc"].update(storageClassName="other"), True, True),
        (lambda s: s["model"]["cache"]["pvc"].update(
            accessModes=["ReadWriteOnce", "ReadOnlyMany"]), True, True),
        (lambda s: s["decode"].update(replicas=9), False, False),
    ],
)  # fmt: skip
def test_names_change_exactly_when_the_object_could_not_be_updated(edit, new_claim, new_job):
    llmd = example("full")
    before = _names(llmd)
    edit(llmd["spec"])
    after = _names(llmd)
    assert (after["PersistentVolumeClaim"] != before["PersistentVolumeClaim"]) is new_claim
    assert (after["Job"] != before["Job"]) is new_job


def test_names_fit_a_job_name_label():
    llmd = example("full")
    llmd["metadata"]["name"] = "x" * 40
    assert all(len(name) <= 63 for name in _names(llmd).values())


def test_the_cache_does_not_change_the_revision():
    """The weights are the same: pods roll (the model path changes) but stay compatible."""
    with_cache, without = example("full"), example("full")
    del without["spec"]["model"]["cache"]
    labels = [deployments(llmd)[0]["spec"]["template"]["metadata"]["labels"]
              for llmd in (with_cache, without)]  # fmt: skip
    assert labels[0][REVISION_LABEL] == labels[1][REVISION_LABEL]


def test_an_existing_claim_is_used_not_created():
    llmd = example("full")
    llmd["spec"]["model"]["cache"] = {"existingClaim": "shared-models"}
    assert validate(llmd) == []
    objects = cache_objects(llmd)
    assert set(objects) == {"Job"}
    volume = objects["Job"]["spec"]["template"]["spec"]["volumes"][0]
    assert volume["persistentVolumeClaim"] == {"claimName": "shared-models"}
    model = next(v for v in deployments(llmd)[0]["spec"]["template"]["spec"]["volumes"]
                 if v["name"] == "model")  # fmt: skip
    assert model["persistentVolumeClaim"]["claimName"] == "shared-models"


@pytest.mark.parametrize(
    ("cache", "source", "operator_error", "crd_error"),
    [
        ({"existingClaim": "m"}, {"pvc": {"claimName": "m"}}, "spec.model.cache: only a "
         "huggingFace", "only a huggingFace source"),
        ({"pvc": {"size": "1Gi"}, "existingClaim": "m"}, None, "spec.model.cache: exactly one",
         "exactly one of pvc, existingClaim"),
        ({"pvc": {"size": "1Gi", "accessModes": ["ReadOnlyMany"]}}, None,
         "spec.model.cache.pvc.accessModes: the download Job writes", "must include ReadWrite"),
        ({"pvc": {"size": "1Gi", "accessModes": []}}, None, "spec.model.cache.pvc.accessModes",
         "spec.model.cache.pvc.accessModes"),
        ({"pvc": {"size": "lots"}}, None, "spec.model.cache.pvc.size", "spec.model.cache.pvc.size"),
        ({"pvc": {}}, None, "spec.model.cache.pvc.size: is required", "'size' is a required"),
    ],
)  # fmt: skip
def test_bad_caches_are_refused_by_the_crd_and_the_operator(cache, source, operator_error,
                                                            crd_error):  # fmt: skip
    llmd = example("full")
    llmd["spec"]["model"]["cache"] = cache
    if source is not None:
        llmd["spec"]["model"]["source"] = source
    with pytest.raises(ValueError, match=operator_error.replace(".", r"\.")):
        render(llmd)
    errors = validate(llmd)
    assert any(crd_error in e for e in errors), errors


def test_a_repo_or_revision_cannot_leave_its_folder():
    llmd = example("full")
    llmd["spec"]["model"]["source"]["huggingFace"]["revision"] = "../../other"
    with pytest.raises(ValueError, match=r"^spec\.model\.cache: the repo and revision"):
        render(llmd)


def progress(state, pods=()):
    return CacheProgress("qwen-cache-0bc7adfdea", "qwen-download-6c32fb282b", JOBS.get(state),
                         list(pods))  # fmt: skip


def test_progress_of_a_job_not_yet_created_and_running():
    assert not progress(None).complete and progress(None).failure is None
    assert progress(None).describe() == "Job qwen-download-6c32fb282b is not created yet"
    assert progress("running").describe() == (
        "Job qwen-download-6c32fb282b is downloading into claim qwen-cache-0bc7adfdea"
    )


def test_a_retry_says_why_the_last_attempt_failed():
    line = progress("retrying", JOBS["failed_pods"][:1]).describe()
    assert line.endswith("(attempt 1 of 5 failed: requests.exceptions.ConnectionError: "
                         "HTTPSConnectionPool(host='huggingface.co', port=443))")  # fmt: skip


def test_a_failed_job_reports_its_reason_and_the_newest_error():
    failed = progress("failed", JOBS["failed_pods"])
    assert not failed.complete
    assert failed.failure == (
        "Job qwen-download-6c32fb282b failed (Job has reached the specified backoff limit): "
        "huggingface_hub.errors.GatedRepoError: 401 Client Error. Cannot access gated repo "
        "for url https://huggingface.co/api/models/Qwen/Qwen3-32B."
    )
    assert failed.describe().endswith("; delete the Job to retry")


def test_a_complete_job():
    done = progress("complete")
    assert done.complete and done.failure is None
    assert done.describe() == (
        "downloaded into claim qwen-cache-0bc7adfdea by Job qwen-download-6c32fb282b"
    )


def test_last_error_ignores_pods_without_a_failure():
    assert last_error([]) == ""
    assert last_error([{"status": {"containerStatuses": [{"state": {"running": {}}}]}}]) == ""
