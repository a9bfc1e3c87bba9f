"""`spec.slo`: read with its defaults, each refusal naming its field (by the operator and by
the CRD), one owner per pool's count (the planner or an HPA), and an SLO refused through the
reconcile the way every invalid spec is (SpecValid False, one Warning Event)."""

from __future__ import annotations

import copy
import json

import pytest

from tandem.operator.reconcile import Reconciler
from tandem.operator.render import render
from tandem.operator.slo import PoolBounds, SLOSpec, running_threshold
from tandem.operator.spec import parse
from tests.operator.crd_schema import example, validate, with_defaults
from tests.operator.fake_api import FakeApi

SLO = {"ttftMs": 500, "tpotMs": 50, "decode": {"maxReplicas": 8}}


def with_slo(slo: dict, name: str = "minimal") -> dict:
    llmd = example(name)
    llmd["spec"]["slo"] = copy.deepcopy(slo)
    return llmd


def test_no_slo_is_none():
    assert parse(example("minimal")).slo is None


def test_defaults():
    assert parse(with_slo(SLO)).slo == SLOSpec(
        ttft_s=0.5, tpot_s=0.05, attainment=0.9, interval_s=30.0, scale_down_window_s=300.0,
        cooldown_s=60.0, prefill=None, decode=PoolBounds(1, 8), profile=None, model=None,
    )  # fmt: skip


def test_every_field():
    slo = {
        "ttftMs": 250.5, "tpotMs": 20, "attainment": 1, "interval": "2m",
        "scaleDownWindow": "0s", "cooldown": "1500ms",
        "prefill": {"maxReplicas": 4}, "decode": {"minReplicas": 2, "maxReplicas": 16},
        "simulator": {"profile": "h100", "model": "/models/llama-3.1-8b-instruct"},
        "remotePrefillThresholds": [2048, 0, 512],
    }  # fmt: skip
    parsed = parse(with_slo(slo)).slo
    assert parsed == SLOSpec(
        ttft_s=0.2505, tpot_s=0.02, attainment=1.0, interval_s=120.0, scale_down_window_s=0.0,
        cooldown_s=1.5, prefill=PoolBounds(0, 4), decode=PoolBounds(2, 16), profile="h100",
        model="/models/llama-3.1-8b-instruct", remote_prefill_thresholds=(0, 512, 2048),
    )  # fmt: skip
    spec = parse(with_slo(slo))
    assert spec.planned("prefill") == PoolBounds(0, 4) == parsed.prefill
    assert spec.planned("router") is None
    assert validate(with_slo(slo)) == []


@pytest.mark.parametrize(
    ("edit", "error"),
    [
        ({"ttftMs": None}, "spec.slo.ttftMs: is required"),
        ({"ttftMs": 0}, "spec.slo.ttftMs: must be greater than 0.0"),
        ({"tpotMs": -5}, "spec.slo.tpotMs: must be greater than 0.0"),
        ({"tpotMs": "50ms"}, "spec.slo.tpotMs: must be a number"),
        ({"attainment": 0}, "spec.slo.attainment: must be greater than 0.0"),
        ({"attainment": 1.5}, "spec.slo.attainment: must be at most 1.0"),
        ({"interval": "4s"}, "spec.slo.interval: must be at least 5s, got '4s'"),
        ({"interval": "30"}, "spec.slo.interval: must match"),
        ({"interval": "1m30s"}, "spec.slo.interval: must match"),
        ({"scaleDownWindow": "-1s"}, "spec.slo.scaleDownWindow: must match"),
        ({"cooldown": 60}, "spec.slo.cooldown: must be a string"),
        ({"decode": None}, "spec.slo: give the bounds of the pools to plan"),
        ({"decode": {}}, "spec.slo.decode.maxReplicas: is required"),
        ({"decode": {"maxReplicas": 1001}}, "spec.slo.decode.maxReplicas: must be at most 1000"),
        ({"decode": {"maxReplicas": 2, "minReplicas": 0}},
         "spec.slo.decode.minReplicas: must be at least 1"),
        ({"decode": {"maxReplicas": 2, "minReplicas": 3}},
         "spec.slo.decode: minReplicas must not exceed maxReplicas"),
        ({"prefill": {"maxReplicas": 0}}, "spec.slo.prefill.maxReplicas: must be at least 1"),
        ({"prefill": {"maxReplicas": 2, "minReplicas": -1}},
         "spec.slo.prefill.minReplicas: must be at least 0"),
        ({"simulator": {"profile": "a100"}}, "spec.slo.simulator.profile: must be one of"),
        ({"simulator": {"model": ""}}, "spec.slo.simulator.model: must not be empty"),
        ({"remotePrefillThresholds": [0, -1]},
         "spec.slo.remotePrefillThresholds: thresholds are integers >= 0, got -1"),
        ({"remotePrefillThresholds": [512, 512]},
         "spec.slo.remotePrefillThresholds: thresholds must differ"),
        ({"remotePrefillThresholds": list(range(9))},
         "spec.slo.remotePrefillThresholds: at most 8 thresholds, got 9"),
        ({"remotePrefillThresholds": 512}, "spec.slo.remotePrefillThresholds: must be a list"),
    ],
)  # fmt: skip
def test_a_refusal_names_its_field(edit, error):
    slo = {key: value for key, value in (SLO | edit).items() if value is not None}
    with pytest.raises(ValueError, match="^" + error.replace(".", r"\.").replace("(", r"\(")):
        parse(with_slo(slo))


@pytest.mark.parametrize(
    ("edit", "error"),
    [
        ({"ttftMs": 0}, "spec.slo.ttftMs"),
        ({"attainment": 1.5}, "spec.slo.attainment"),
        ({"interval": "30"}, "spec.slo.interval"),
        ({"interval": "4s"}, "spec.slo.interval: must be at least 5s"),
        ({"decode": {}}, "'maxReplicas' is a required"),
        ({"decode": {"maxReplicas": 2, "minReplicas": 0}}, "spec.slo.decode.minReplicas"),
        ({"decode": {"maxReplicas": 2, "minReplicas": 3}}, "minReplicas must not exceed"),
        ({"prefill": {"maxReplicas": 0}}, "spec.slo.prefill.maxReplicas"),
        ({"simulator": {"profile": "a100"}}, "spec.slo.simulator.profile"),
        ({"simulator": {"gpu": "h100"}}, "'gpu' was unexpected"),
        ({"remotePrefillThresholds": [0, -1]}, "spec.slo.remotePrefillThresholds.1: -1 is less"),
        ({"remotePrefillThresholds": list(range(9))}, "is too long"),
    ],
)  # fmt: skip
def test_the_crd_refuses_the_same(edit, error):
    errors = validate(with_slo(SLO | edit))
    assert any(error in e for e in errors), errors


def test_the_crd_asks_for_a_pool():
    errors = validate(with_slo({"ttftMs": 500, "tpotMs": 50}))
    assert errors == ["spec.slo: give the bounds of the pools to plan: prefill, decode or both"]


def test_the_crd_defaults_are_the_operators():
    llmd = with_slo({**SLO, "prefill": {"maxReplicas": 2}})
    filled = with_defaults(llmd)["spec"]["slo"]
    assert (filled["interval"], filled["prefill"]["minReplicas"]) == ("30s", 0)
    assert filled["decode"]["minReplicas"] == 1
    assert render(with_defaults(llmd)) == render(llmd)


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_pool_is_planned_or_autoscaled_not_both(role):
    llmd = with_slo({**SLO, role: {"maxReplicas": 4}})
    llmd["spec"]["autoscaling"] = {role: {"maxReplicas": 4}}
    error = (
        f"spec.slo.{role}: the {role} pool is scaled by spec.autoscaling.{role} already: choose one"
    )
    with pytest.raises(ValueError) as refused:
        parse(llmd)
    assert str(refused.value) == error
    (crd_error,) = validate(llmd)
    assert crd_error.startswith(f"spec.slo.{role}: the {role} pool is scaled by")


def test_the_other_pool_and_the_router_may_autoscale():
    llmd = with_slo({**SLO, "decode": {"maxReplicas": 4}})
    llmd["spec"]["autoscaling"] = {"prefill": {"maxReplicas": 4}}
    spec = parse(llmd)
    assert spec.planned("decode") is not None and spec.prefill.scaling is not None
    assert validate(llmd) == []


def test_a_refused_slo_is_reported_and_changes_nothing():
    api, llmd = FakeApi(), with_slo(SLO)
    run = Reconciler(api, now=lambda: "2026-11-21T10:00:00Z")
    run.reconcile(llmd)
    stored = copy.deepcopy(api.objects)
    llmd["spec"]["autoscaling"] = {"decode": {"maxReplicas": 4}}
    outcome = run.reconcile(llmd)
    assert outcome.spec_error == (
        "spec.slo.decode: the decode pool is scaled by spec.autoscaling.decode already: choose one"
    )
    assert outcome.applied == [] and api.objects == stored
    assert api.warnings == [("Warning", "InvalidSpec", outcome.spec_error)]
    spec_valid = next(c for c in api.statuses[-1]["conditions"] if c["type"] == "SpecValid")
    assert (spec_valid["status"], spec_valid["message"]) == ("False", outcome.spec_error)
    assert api.statuses[-1]["phase"] == "Invalid"


def test_the_crd_keeps_the_planners_status():
    """`status.planner` is in the schema (the API server would prune an unknown key), and
    keys the planner adds inside it are kept."""
    llmd = with_slo(SLO)
    llmd["status"] = {"phase": "Ready", "planner": {
        "prefill": {"current": 0, "desired": 1}, "decode": {"current": 2, "desired": 3},
        "predictedAttainment": 0.94, "measuredAttainment": 0.88, "requestRate": 12.5,
        "reason": "tpot over target", "searchSeconds": 1.2,
        "lastChange": "2026-11-21T10:00:00Z", "window": "5m",
        "remotePrefillThreshold": 512}}  # fmt: skip
    assert validate(llmd) == []
    llmd["status"]["plan"] = {}
    assert any("'plan' was unexpected" in e for e in validate(llmd))


@pytest.mark.parametrize(
    ("slo", "max_len", "grace"),
    [
        ({"ttftMs": 800, "tpotMs": 60}, 4096, 247),  # 0.8 s + 4,096 tokens at 60 ms
        ({"ttftMs": 800, "tpotMs": 60}, None, 120),  # the model's length: unknown here
        ({"ttftMs": 100, "tpotMs": 1}, 4096, 120),  # shorter than the default: the default
        ({"ttftMs": 800, "tpotMs": 500}, 131072, 3600),  # a day: capped at an hour
    ],
)
def test_the_grace_lets_the_longest_request_within_the_slo_finish(slo, max_len, grace):
    llmd = with_slo({**slo, "decode": {"maxReplicas": 2}})
    if max_len is not None:
        llmd["spec"]["model"]["maxModelLen"] = max_len
    pools = [
        o
        for o in render(llmd)
        if o["kind"] == "Deployment" and "planner" not in o["metadata"]["name"]
    ]
    assert pools and all(
        d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == grace for d in pools
    )


@pytest.mark.parametrize(
    ("listed", "chosen", "running"),
    [
        ([], 512, 256),  # the planner may not choose: the spec's
        ([0, 512], 512, 512),  # its choice, among those listed
        ([0, 512], None, 256),  # not chosen yet: the spec's, where it starts
        ([0, 512], 1024, 256),  # not listed (an old choice, a hand edit): the spec's
        ([0, 512], 256, 256),  # the spec's own is always allowed
        ([0, 512], True, 256),  # not a number
    ],
)
def test_the_running_threshold_is_the_planners_choice_only_among_those_listed(
    listed, chosen, running
):
    llmd = with_slo({**SLO, "remotePrefillThresholds": listed})
    llmd["spec"]["disaggregation"] = {"remotePrefillThreshold": 256}
    status = {"planner": {"remotePrefillThreshold": chosen}}
    spec = parse(llmd)
    assert running_threshold(spec.slo, status, spec.remote_prefill_threshold) == running


def decode_flags(api: FakeApi) -> dict:
    (config,) = [obj for (kind, _, _), obj in api.objects.items() if kind == "ConfigMap"]
    return json.loads(config["data"]["decode.json"])


def pod_hashes(api: FakeApi) -> dict[str, str]:
    return {
        name: obj["spec"]["template"]["metadata"]["annotations"]["tandem.dev/config-hash"]
        for (kind, _, name), obj in api.objects.items()
        if kind == "Deployment" and not name.endswith("planner")
    }


def test_the_planners_threshold_is_rendered_and_rolls_the_decode_pods_alone():
    api = FakeApi()
    llmd = with_slo({**SLO, "prefill": {"maxReplicas": 2}, "remotePrefillThresholds": [0, 512]})
    run = Reconciler(api, now=lambda: "2026-11-28T10:00:00Z")
    run.reconcile(llmd)
    assert decode_flags(api)["remote-prefill-threshold"] == 0
    before = pod_hashes(api)
    assert not run.threshold_changed(llmd)
    llmd["status"] = {"planner": {"remotePrefillThreshold": 512}}
    assert run.threshold_changed(llmd)  # the handler reconciles on this status change
    run.reconcile(copy.deepcopy(llmd))  # (the fake writes the status into what it is given)
    assert not run.threshold_changed(llmd)
    assert decode_flags(api)["remote-prefill-threshold"] == 512
    after = pod_hashes(api)
    assert after["llama-decode"] != before["llama-decode"]
    assert {k: v for k, v in after.items() if k != "llama-decode"} == {
        k: v for k, v in before.items() if k != "llama-decode"
    }
