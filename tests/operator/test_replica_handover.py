"""A planned (or HPA-scaled) pool's replica count: created at the pool's minReplicas, handed
to a manager of its own before the operator applies the Deployment without it, so that the
count survives a fixed pool made planned, and the planner's scaling survives every
reconcile. The fake API models server-side apply's ownership of `spec.replicas` (checked
against a real API server too: docs/kubernetes.md "SLO autoscaling")."""

from __future__ import annotations

import copy

from tandem.operator.kinds import DEPLOYMENT
from tandem.operator.names import FIELD_MANAGER
from tandem.operator.reconcile import Reconciler
from tandem.operator.render import render
from tandem.operator.replica_handover import HANDOVER_MANAGER, hand_over_replicas
from tests.operator.crd_schema import example
from tests.operator.fake_api import SCALER, FakeApi

SLO = {"ttftMs": 800, "tpotMs": 60, "decode": {"minReplicas": 2, "maxReplicas": 8}}


def reconcile(api: FakeApi, llmd: dict) -> None:
    Reconciler(api, now=lambda: "2026-11-21T10:00:00Z").reconcile(llmd)


def pool(api: FakeApi, role: str) -> tuple[int, dict[str, str]]:
    """The pool's count and who holds it (manager -> operation)."""
    key = ("Deployment", "default", f"llama-{role}")
    return api.objects[key]["spec"]["replicas"], api.replica_managers[key]


def rendered(llmd: dict, role: str) -> dict:
    (found,) = [o for o in render(llmd) if o["kind"] == "Deployment"
                and o["metadata"]["name"] == f"llama-{role}"]  # fmt: skip
    return found


def planned(slo: dict | None = None, **pools) -> dict:
    llmd = example("minimal")
    llmd["spec"]["slo"] = copy.deepcopy(slo or SLO)
    llmd["spec"] |= pools
    return llmd


def test_the_fake_resets_a_count_its_only_manager_drops():
    """What the handover prevents, as a real API server does it."""
    api, llmd = FakeApi(), example("minimal")
    llmd["spec"]["decode"] = {"replicas": 4}
    reconcile(api, llmd)
    decode = rendered(llmd, "decode")
    del decode["spec"]["replicas"]
    api.apply(decode)
    assert pool(api, "decode") == (1, {})


def test_planned_pools_start_at_their_minimum():
    slo = SLO | {"prefill": {"maxReplicas": 4}}
    api, llmd = FakeApi(), planned(slo, prefill={"replicas": 0})
    reconcile(api, llmd)
    assert pool(api, "decode") == (2, {HANDOVER_MANAGER: "Apply"})
    assert pool(api, "prefill") == (0, {HANDOVER_MANAGER: "Apply"})
    assert pool(api, "router") == (1, {FIELD_MANAGER: "Apply"})
    stored = copy.deepcopy(api.objects)
    reconcile(api, llmd)
    assert api.objects == stored


def test_the_planners_count_survives_every_reconcile():
    api, llmd = FakeApi(), planned()
    reconcile(api, llmd)
    api.scale(DEPLOYMENT, "default", "llama-decode", 5)
    reconcile(api, llmd)
    reconcile(api, llmd)
    assert pool(api, "decode") == (5, {SCALER: "Update"})


def test_a_fixed_pool_made_planned_keeps_its_count():
    api, llmd = FakeApi(), example("minimal")
    llmd["spec"]["decode"] = {"replicas": 4}
    reconcile(api, llmd)
    assert pool(api, "decode") == (4, {FIELD_MANAGER: "Apply"})
    llmd["spec"]["slo"] = copy.deepcopy(SLO)
    reconcile(api, llmd)
    assert pool(api, "decode") == (4, {HANDOVER_MANAGER: "Apply"})


def test_without_slo_the_spec_count_is_applied_again():
    api, llmd = FakeApi(), planned(decode={"replicas": 3})
    reconcile(api, llmd)
    api.scale(DEPLOYMENT, "default", "llama-decode", 6)
    del llmd["spec"]["slo"]
    reconcile(api, llmd)
    assert pool(api, "decode") == (3, {FIELD_MANAGER: "Apply"})
    assert "Deployment/llama-planner" in api.deleted


def test_a_count_the_planner_took_meanwhile_is_left_to_it():
    """Read before the planner's scale, handed over after it: the unforced apply conflicts
    and changes nothing."""
    api, llmd = FakeApi(), example("minimal")
    llmd["spec"]["decode"] = {"replicas": 4}
    reconcile(api, llmd)
    stale = api.get
    before = copy.deepcopy(api.objects)
    api.get = lambda kind, namespace, name, timeout_s=None: copy.deepcopy(
        before.get((kind.kind, namespace, name))
    )
    api.scale(DEPLOYMENT, "default", "llama-decode", 6)
    hand_over_replicas(api, rendered(planned(), "decode"), 2)
    api.get = stale
    assert pool(api, "decode") == (6, {SCALER: "Update"})


def test_the_handover_applies_the_count_alone():
    api, llmd = FakeApi(), planned()
    reconcile(api, llmd)
    template = api.objects[("Deployment", "default", "llama-decode")]["spec"]["template"]
    assert template == rendered(llmd, "decode")["spec"]["template"]


def test_an_hpa_pool_starts_at_its_minimum_and_a_fixed_pool_made_autoscaled_keeps_its_count():
    """The HPA's pools get the same handover: created at minReplicas rather than 1 (which
    the HPA would raise again a sync later), and a fixed count kept rather than dropped."""
    api, llmd = FakeApi(), example("minimal")
    llmd["spec"]["autoscaling"] = {"prefill": {"minReplicas": 3, "maxReplicas": 6}}
    llmd["spec"]["decode"] = {"replicas": 4}
    reconcile(api, llmd)
    assert pool(api, "prefill") == (3, {HANDOVER_MANAGER: "Apply"})
    assert pool(api, "decode") == (4, {FIELD_MANAGER: "Apply"})
    llmd["spec"]["autoscaling"]["decode"] = {"minReplicas": 1, "maxReplicas": 8}
    reconcile(api, llmd)
    assert pool(api, "decode") == (4, {HANDOVER_MANAGER: "Apply"})
    assert pool(api, "router") == (1, {FIELD_MANAGER: "Apply"})
