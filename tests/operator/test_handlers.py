"""The kopf wiring: which handlers exist on which resource, what they pass to the reconcile,
how failures reach kopf, and the settings the operator runs under."""

from __future__ import annotations

import logging

import kopf
import pytest
import yaml
from prometheus_client import CollectorRegistry

from tandem.operator.handlers import ResourceLocks, build_registry
from tandem.operator.kube import ApiError
from tandem.operator.metrics import OperatorMetrics
from tandem.operator.reconcile import Outcome, Reconciler
from tests.operator.crd_schema import example
from tests.operator.fake_api import FakeApi


class RecordingReconciler:
    def __init__(self, error: Exception | None = None, spec_error: str | None = None) -> None:
        self.seen: list[dict] = []
        self.error, self.spec_error = error, spec_error

    def reconcile(self, llmd: dict) -> Outcome:
        self.seen.append(llmd)
        if self.error is not None:
            raise self.error
        return Outcome(applied=["Deployment/a", "Service/a"], spec_error=self.spec_error)

    def forget(self, uid: str) -> None:
        pass

    def threshold_changed(self, llmd: dict) -> bool:
        return False


def wiring(reconciler):
    metrics = OperatorMetrics(CollectorRegistry())
    return build_registry(reconciler, metrics, interval_s=30), metrics


def sample(metrics, name, **labels):
    return metrics.registry.get_sample_value(name, labels or None) or 0


def test_create_update_resume_and_a_timer_on_llmdeployments():
    registry, _ = wiring(RecordingReconciler())
    changing = registry._changing.get_all_handlers()
    assert sorted(str(h.reason) for h in changing if h.reason) == ["create", "update"]
    assert [h.initial for h in changing if h.reason is None] == [True]  # resume
    assert len({h.id for h in changing}) == 3
    (timer,) = registry._spawning.get_all_handlers()
    assert (timer.interval, timer.idle) == (30, 15)
    (watch,) = registry._watching.get_all_handlers()  # deletions: no finalizer
    assert watch.id == "forget-on-delete"
    for handler in [*changing, timer]:
        selector = handler.selector
        assert (selector.group, selector.version, selector.any_name) == (
            "tandem.dev", "v1alpha1", "llmdeployments"
        )  # fmt: skip


def test_handlers_pass_a_private_plain_copy_and_count():
    reconciler = RecordingReconciler()
    registry, metrics = wiring(reconciler)
    body = kopf.Body(example("minimal"))
    create = next(h for h in registry._changing.get_all_handlers() if str(h.reason) == "create")
    create.fn(body=body, reason=kopf.Reason.CREATE)
    (timer,) = registry._spawning.get_all_handlers()
    timer.fn(body=body)
    assert [type(seen) for seen in reconciler.seen] == [dict, dict]
    assert reconciler.seen[0] == example("minimal")
    reconciler.seen[0]["spec"]["model"]["name"] = "changed"
    assert body["spec"]["model"]["name"] == "llama-3.1-8b-instruct"
    assert (
        sample(metrics, "tandem_operator_reconciles_total", trigger="create", result="success") == 1
    )
    assert (
        sample(metrics, "tandem_operator_reconciles_total", trigger="timer", result="success") == 1
    )
    assert sample(metrics, "tandem_operator_applied_objects_total") == 4


def test_api_errors_become_temporary_errors_and_invalid_specs_are_counted():
    registry, metrics = wiring(RecordingReconciler(error=ApiError(500, "etcd is unhappy")))
    (timer,) = registry._spawning.get_all_handlers()
    with pytest.raises(kopf.TemporaryError, match="etcd is unhappy"):
        timer.fn(body=kopf.Body(example("minimal")))
    assert sample(metrics, "tandem_operator_reconciles_total", trigger="timer", result="error") == 1
    registry, metrics = wiring(RecordingReconciler(spec_error="spec.x: bad"))
    (timer,) = registry._spawning.get_all_handlers()
    timer.fn(body=kopf.Body(example("minimal")))
    assert (
        sample(metrics, "tandem_operator_reconciles_total", trigger="timer", result="invalid") == 1
    )


def activity(registry, kind: str):
    """The one handler of an activity ("startup", "authentication", ...)."""
    (handler,) = [h for h in registry._activities.get_all_handlers() if h.activity.value == kind]
    return handler


def test_startup_keeps_kopf_out_of_status_and_off_cluster_wide_watches():
    registry, _ = wiring(RecordingReconciler())
    startup = activity(registry, "startup")
    settings = kopf.OperatorSettings()
    startup.fn(settings=settings)
    assert isinstance(settings.persistence.progress_storage, kopf.AnnotationsProgressStorage)
    assert settings.persistence.progress_storage.prefix == "tandem.dev"
    assert settings.scanning.disabled is True
    assert settings.posting.level == logging.WARNING


def test_kopf_logs_in_with_the_operators_own_client_configuration(tmp_path, monkeypatch):
    """kopf adds its default login handlers only to its global registry: a private one
    needs its own, or kopf runs out of credentials at once."""
    ca = tmp_path / "ca.crt"
    ca.write_text("not read here")
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {
            "server": "https://127.0.0.1:6443", "certificate-authority": str(ca)}}],
        "users": [{"name": "u", "user": {"token": "s3cret"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }  # fmt: skip
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(config))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    registry, _ = wiring(RecordingReconciler())
    info = activity(registry, "authentication").fn()
    assert isinstance(info, kopf.ConnectionInfo)
    assert (info.server, info.scheme, info.token) == ("https://127.0.0.1:6443", "Bearer", "s3cret")
    assert info.ca_path == str(ca) and info.insecure is False


def test_a_deleted_resource_leaves_no_lock_and_no_warning_behind():
    reconciler, locks = Reconciler(FakeApi()), ResourceLocks()
    registry = build_registry(reconciler, OperatorMetrics(CollectorRegistry()), 30, locks)
    create = next(h for h in registry._changing.get_all_handlers() if str(h.reason) == "create")
    (watch,) = registry._watching.get_all_handlers()
    for i in range(50):
        llmd = example("minimal")
        llmd["metadata"]["uid"] = f"uid-{i}"
        llmd["spec"]["decode"] = {"replicas": -1}  # invalid: one warning Event each
        create.fn(body=kopf.Body(llmd), reason=kopf.Reason.CREATE)
        assert len(locks) == 1 and reconciler.num_warned_resources == 1
        watch.fn(type="DELETED", body=kopf.Body(llmd))
        assert len(locks) == 0 and reconciler.num_warned_resources == 0


def test_a_new_threshold_in_the_planners_status_reconciles_at_once():
    """kopf's change handlers see the spec, not the status: the watch handler reconciles
    when the planner's chosen remote-prefill threshold differs from the one rendered, and
    only then (the operator's own status writes are watch events too)."""
    api = FakeApi()
    reconciler = Reconciler(api, now=lambda: "2026-11-28T10:00:00Z")
    registry, metrics = wiring(reconciler)
    llmd = example("slo")
    llmd["spec"]["slo"]["remotePrefillThresholds"] = [0, 1024]
    reconciler.reconcile(llmd)
    (watch,) = registry._watching.get_all_handlers()
    watch.fn(type="MODIFIED", body=kopf.Body(llmd))
    planner_runs = {"trigger": "planner", "result": "success"}
    assert sample(metrics, "tandem_operator_reconciles_total", **planner_runs) == 0
    llmd["status"] = {"planner": {"remotePrefillThreshold": 1024}}
    watch.fn(type="MODIFIED", body=kopf.Body(llmd))
    watch.fn(type="MODIFIED", body=kopf.Body(llmd))
    assert sample(metrics, "tandem_operator_reconciles_total", **planner_runs) == 1
    config = api.objects[("ConfigMap", "inference", "llama-config")]
    assert '"remote-prefill-threshold": 1024' in config["data"]["decode.json"]
