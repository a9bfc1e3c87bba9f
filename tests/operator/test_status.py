"""compute_status() from recorded Deployment and Job statuses."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tandem.operator.model_cache import CacheProgress
from tandem.operator.status import Observation, compute_status

FIXTURES = Path(__file__).parent / "fixtures"
DEPLOYMENTS = yaml.safe_load((FIXTURES / "deployments.yaml").read_text())
JOBS = yaml.safe_load((FIXTURES / "jobs.yaml").read_text())
URL = "http://llama-router.default.svc:8000"
T0, T1 = "2026-11-21T10:00:00Z", "2026-11-21T10:05:00Z"
CLAIM, JOB = "qwen-cache-0bc7adfdea", "qwen-download-6c32fb282b"


def status_of(router, prefill, decode, previous=None, spec_error=None, now=T0, **observed):
    deployments = {"router": DEPLOYMENTS.get(router), "decode": DEPLOYMENTS.get(decode)}
    if prefill is not None:
        deployments["prefill"] = DEPLOYMENTS.get(prefill)
    observation = Observation(
        7, deployments, "" if spec_error else URL, spec_error, previous or {}, **observed
    )
    return compute_status(observation, now)


def download(state, pods=()):
    return CacheProgress(CLAIM, JOB, JOBS.get(state), list(pods))


def condition(status, kind):
    return next(c for c in status["conditions"] if c["type"] == kind)


def conditions(status):
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_all_rolled_out_is_ready():
    status = status_of("ready", "ready", "ready")
    assert status["phase"] == "Ready" and status["observedGeneration"] == 7
    assert conditions(status) == {
        "Ready": ("True", "AllRolesAvailable"),
        "Progressing": ("False", "RolloutComplete"),
        "Degraded": ("False", "AsExpected"),
        "SpecValid": ("True", "Valid"),
        "HardeningRelaxed": ("False", "HardenedDefaults"),
    }
    assert status["decode"] == {
        "replicas": 2,
        "readyReplicas": 2,
        "updatedReplicas": 2,
        "ready": "2/2",
    }
    assert status["routerURL"] == URL and status["revision"] == "734cb7c40e"


def test_a_rolling_pool_is_progressing_and_keeps_the_old_revision():
    previous = {"revision": "734cb7c40e"}
    status = status_of("ready", "ready", "rolling", previous=previous)
    assert status["phase"] == "Progressing"
    assert conditions(status)["Ready"] == ("True", "AllRolesAvailable")
    progressing = next(c for c in status["conditions"] if c["type"] == "Progressing")
    assert progressing["status"] == "True" and "decode" in progressing["message"]
    assert status["revision"] == "734cb7c40e"
    assert status["decode"]["ready"] == "2/2" and status["decode"]["updatedReplicas"] == 1


def test_a_template_not_yet_observed_counts_as_rolling():
    status = status_of("ready", "ready", "not_observed", previous={"revision": "old"})
    assert conditions(status)["Progressing"][0] == "True"
    assert status["revision"] == "old"


def test_nothing_created_yet_is_pending():
    status = status_of(None, None, None)
    assert status["phase"] == "Pending"
    assert conditions(status)["Ready"] == ("False", "RolesUnavailable")
    assert status["router"]["ready"] == "0/1"


def test_pods_starting_are_not_ready():
    status = status_of("starting", "starting", "starting")
    assert status["phase"] == "Progressing"
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and "router, prefill, decode" in ready["message"]


@pytest.mark.parametrize(("decode", "fragment"), [("stuck", "timed out"), ("short", "2/3 ready")])
def test_degraded_when_a_rollout_is_stuck_or_pods_are_missing(decode, fragment):
    status = status_of("ready", "ready", decode)
    assert status["phase"] == "Degraded"
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and fragment in degraded["message"]


def test_invalid_spec_is_reported_and_the_last_good_values_kept():
    previous = status_of("ready", "ready", "ready")
    status = status_of(
        "ready", "ready", "ready", previous=previous, spec_error="spec.x: bad", now=T1
    )
    assert status["phase"] == "Invalid"
    spec_valid = next(c for c in status["conditions"] if c["type"] == "SpecValid")
    assert spec_valid == {"type": "SpecValid", "status": "False", "reason": "InvalidSpec",
                          "message": "spec.x: bad", "lastTransitionTime": T1}  # fmt: skip
    assert status["routerURL"] == URL and status["revision"] == "734cb7c40e"


def test_transition_times_move_only_on_a_status_change():
    first = status_of("ready", "ready", "ready", now=T0)
    again = status_of("ready", "ready", "ready", previous=first, now=T1)
    assert all(c["lastTransitionTime"] == T0 for c in again["conditions"])
    rolled = status_of("ready", "ready", "rolling", previous=again, now=T1)
    times = {c["type"]: c["lastTransitionTime"] for c in rolled["conditions"]}
    assert times == {"Ready": T0, "Progressing": T1, "Degraded": T0, "SpecValid": T0,
                     "HardeningRelaxed": T0}  # fmt: skip


def test_relaxed_hardening_is_reported_without_changing_the_phase():
    relaxed = ("decode: privileged, capabilities SYS_ADMIN",)
    status = status_of("ready", "ready", "ready", relaxed=relaxed)
    assert status["phase"] == "Ready"
    assert condition(status, "HardeningRelaxed") | {"lastTransitionTime": None} == {
        "type": "HardeningRelaxed", "status": "True", "reason": "SecurityOverrides",
        "message": "securityOverrides relax the hardened defaults: "
                   "decode: privileged, capabilities SYS_ADMIN",
        "lastTransitionTime": None,
    }  # fmt: skip


def test_a_model_downloading_is_pending_and_progressing():
    status = status_of(None, None, None, cache=download("running"))
    assert status["phase"] == "Pending"
    assert conditions(status)["ModelCached"] == ("False", "Downloading")
    progressing = condition(status, "Progressing")
    assert progressing["reason"] == "DownloadingModel"
    assert progressing["message"].startswith(f"downloading the model (Job {JOB}); rolling out")
    assert status["modelCache"] == {"claimName": CLAIM, "jobName": JOB}


def test_a_new_revision_downloading_keeps_the_old_pods_serving():
    status = status_of("ready", "ready", "ready", cache=download(None))
    assert status["phase"] == "Progressing" and conditions(status)["Ready"][0] == "True"
    assert condition(status, "ModelCached")["message"] == f"Job {JOB} is not created yet"


def test_a_failed_download_degrades_with_its_error():
    status = status_of(None, None, None, cache=download("failed", JOBS["failed_pods"]))
    assert status["phase"] == "Degraded"
    cached = condition(status, "ModelCached")
    assert (cached["status"], cached["reason"]) == ("False", "DownloadFailed")
    assert "GatedRepoError: 401" in cached["message"]
    assert "delete the Job to retry" in cached["message"]
    degraded = condition(status, "Degraded")
    assert degraded["status"] == "True" and "model cache: Job" in degraded["message"]
    assert conditions(status)["Progressing"][0] == "False"


def test_a_downloaded_model_is_cached():
    status = status_of("ready", "ready", "ready", cache=download("complete"))
    assert status["phase"] == "Ready"
    assert conditions(status)["ModelCached"] == ("True", "Downloaded")


def test_an_invalid_spec_keeps_the_cache_and_hardening_as_they_were():
    before = status_of("ready", "ready", "ready", cache=download("complete"),
                       relaxed=("decode: privileged",))  # fmt: skip
    status = status_of("ready", "ready", "ready", previous=before, spec_error="spec.x: bad",
                       now=T1)  # fmt: skip
    for kind in ("ModelCached", "HardeningRelaxed"):
        assert condition(status, kind) == condition(before, kind)
    assert status["modelCache"] == before["modelCache"]
