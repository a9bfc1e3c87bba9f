"""compute_status() from recorded Deployment statuses."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tandem.operator.status import Observation, compute_status

DEPLOYMENTS = yaml.safe_load((Path(__file__).parent / "fixtures" / "deployments.yaml").read_text())
URL = "http://llama-router.default.svc:8000"
T0, T1 = "2026-11-21T10:00:00Z", "2026-11-21T10:05:00Z"


def status_of(router, prefill, decode, previous=None, spec_error=None, now=T0):
    deployments = {"router": DEPLOYMENTS.get(router), "decode": DEPLOYMENTS.get(decode)}
    if prefill is not None:
        deployments["prefill"] = DEPLOYMENTS.get(prefill)
    observation = Observation(7, deployments, "" if spec_error else URL, spec_error, previous or {})
    return compute_status(observation, now)


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
    assert times == {"Ready": T0, "Progressing": T1, "Degraded": T0, "SpecValid": T0}
