"""An LLMDeployment's life on a real API server, reconciled by the real `tandem operator`
process authenticated as the chart's ServiceAccount (so the chart's RBAC is proven
sufficient): create, update, steady state, prune, delete, bad specs, and pod security."""

from __future__ import annotations

import pytest

from tandem.operator.kinds import CHILD_KINDS, DEPLOYMENT, HPA, JOB, LLM_DEPLOYMENT, child_kind
from tandem.operator.kube import ApiError
from tandem.operator.names import FIELD_MANAGER, REVISION_LABEL
from tandem.operator.reconcile import OPTIONAL_GROUPS
from tests.disagg.nodes import wait_until
from tests.operator.e2e.cluster import OperatorProc
from tests.operator.e2e.helpers import (
    HANG_S,
    all_children_exist,
    condition,
    create,
    delete,
    events,
    expected_children,
    get_child,
    llmd_from,
    patch_spec,
    pods,
    read,
    resource_versions,
    wait_condition,
)

pytestmark = pytest.mark.e2e
PVC = next(k for k in CHILD_KINDS if k.kind == "PersistentVolumeClaim")


@pytest.fixture(scope="module")
def operator(setup, operator_logs):
    proc = OperatorProc(operator_logs, setup, "op-lifecycle").start()
    try:
        proc.wait_ready(timeout=300)
        assert wait_until(lambda: proc.counter("tandem_operator_leader") == 1, timeout=HANG_S)
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def llmd(setup, operator, request):
    """A fresh LLMDeployment of the test's own name, deleted afterwards."""
    body = llmd_from(request.node.name.replace("_", "-")[5:40].strip("-"), setup.watched)
    yield body
    delete(setup.api, body)


def test_create_applies_every_child_owned_and_managed_with_status_and_events(setup, llmd):
    api = setup.api
    create(api, llmd)
    live = wait_condition(api, llmd, "SpecValid", "True")
    assert wait_until(lambda: all_children_exist(api, live), timeout=HANG_S)
    uid = live["metadata"]["uid"]
    for obj in expected_children(live):
        child = get_child(api, obj)
        (owner,) = child["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == (
            "LLMDeployment",
            llmd["metadata"]["name"],
            uid,
        )
        assert owner["controller"] is True and owner["blockOwnerDeletion"] is True
        managers = {(f["manager"], f["operation"]) for f in child["metadata"]["managedFields"]}
        assert (FIELD_MANAGER, "Apply") in managers, (obj["kind"], managers)
    status = live["status"]
    assert status["observedGeneration"] == live["metadata"]["generation"]
    assert {c["type"] for c in status["conditions"]} >= {"Ready", "Progressing", "SpecValid"}
    assert status["routerURL"].startswith(f"http://{llmd['metadata']['name']}-router.")
    reasons = [(e["type"], e["reason"]) for e in events(api, live)]
    assert ("Normal", "Reconciled") in reasons, reasons


def test_every_pod_is_admitted_under_pod_security_restricted(setup, llmd):
    """The watched namespace enforces "restricted": a rejected pod would never exist (its
    ReplicaSet records FailedCreate instead)."""
    api = setup.api
    create(api, llmd)
    live = wait_condition(api, llmd, "SpecValid", "True")
    name = llmd["metadata"]["name"]
    wanted = sum(
        obj["spec"]["replicas"] for obj in expected_children(live) if obj["kind"] == "Deployment"
    )
    selector = f"tandem.dev/deployment={name}"
    assert wait_until(lambda: len(pods(api, setup.watched, selector)) == wanted, timeout=HANG_S)


def test_a_spec_change_rolls_a_new_revision_that_prefill_and_decode_share(setup, llmd):
    api = setup.api
    create(api, llmd)
    live = wait_condition(api, llmd, "SpecValid", "True")
    assert wait_until(lambda: all_children_exist(api, live), timeout=HANG_S)
    before = {role: _template_revision(setup, llmd, role) for role in ("prefill", "decode")}
    assert before["prefill"] == before["decode"]
    patch_spec(api, llmd, {"engine": {"blockSize": 32}})
    wait_condition(api, llmd, "SpecValid", "True")
    after = {role: _template_revision(setup, llmd, role) for role in ("prefill", "decode")}
    assert after["prefill"] == after["decode"] != before["decode"]
    name = llmd["metadata"]["name"]
    selector = f"tandem.dev/deployment={name},{REVISION_LABEL}={after['decode']}"
    assert wait_until(lambda: len(pods(api, setup.watched, selector)) >= 2, timeout=HANG_S)


def test_prefill_at_zero_replicas_prunes_the_pool(setup, llmd):
    api = setup.api
    create(api, llmd)
    wait_condition(api, llmd, "SpecValid", "True")
    name, ns = llmd["metadata"]["name"], setup.watched
    assert wait_until(
        lambda: api.get(DEPLOYMENT, ns, f"{name}-prefill") is not None, timeout=HANG_S
    )
    patch_spec(api, llmd, {"prefill": {"replicas": 0}})
    live = wait_condition(api, llmd, "SpecValid", "True")
    assert wait_until(lambda: api.get(DEPLOYMENT, ns, f"{name}-prefill") is None, timeout=HANG_S)
    assert all_children_exist(api, live)
    reasons = [e["message"] for e in events(api, live) if e["reason"] == "Reconciled"]
    assert any(f"Deployment/{name}-prefill" in m for m in reasons), reasons


def test_an_hpa_no_longer_rendered_is_pruned(setup, llmd):
    api = setup.api
    llmd["spec"]["autoscaling"] = {"decode": {"maxReplicas": 3}}
    create(api, llmd)
    wait_condition(api, llmd, "SpecValid", "True")
    name, ns = llmd["metadata"]["name"], setup.watched
    assert wait_until(lambda: api.get(HPA, ns, f"{name}-decode") is not None, timeout=HANG_S)
    patch_spec(api, llmd, {"autoscaling": None})
    wait_condition(api, llmd, "SpecValid", "True")
    assert wait_until(lambda: api.get(HPA, ns, f"{name}-decode") is None, timeout=HANG_S)


def test_three_resyncs_of_a_settled_resource_write_nothing(setup, operator, llmd):
    api = setup.api
    create(api, llmd)
    live = wait_condition(api, llmd, "SpecValid", "True")
    assert wait_until(lambda: all_children_exist(api, live), timeout=HANG_S)
    # Settled: every pod created (Deployment statuses stop moving), and one more resync has
    # carried that into the resource's status.
    assert wait_until(lambda: _deployments_settled(setup, live), timeout=HANG_S)
    _wait_for_resyncs(operator, 1)
    before, resource = resource_versions(api, live), read(api, llmd)["metadata"]["resourceVersion"]
    _wait_for_resyncs(operator, 3)
    assert resource_versions(api, live) == before
    assert read(api, llmd)["metadata"]["resourceVersion"] == resource


def test_deleting_the_resource_collects_every_child(setup, llmd):
    api = setup.api
    create(api, llmd)
    live = wait_condition(api, llmd, "SpecValid", "True")
    assert wait_until(lambda: all_children_exist(api, live), timeout=HANG_S)
    delete(api, llmd)
    gone = lambda: all(get_child(api, obj) is None for obj in expected_children(live))  # noqa: E731
    assert wait_until(gone, timeout=HANG_S)


@pytest.mark.parametrize(
    ("spec", "status", "says"),
    [
        ({"decode": {"replicas": "two"}}, 422, "spec.decode.replicas"),  # the OpenAPI schema
        ({"decode": {"replicaz": 2}}, 400, 'unknown field "spec.decode.replicaz"'),  # strict
        ({"model": {"source": {"pvc": {"claimName": "m"}, "hostPath": {"path": "/m"}}}},
         422, "exactly one"),  # a CEL rule
        ({"decode": {"tensorParallelSize": 3}}, 422, "spec.decode.tensorParallelSize"),  # enum
    ],
)  # fmt: skip
def test_the_api_server_refuses_a_bad_spec_naming_the_field(setup, llmd, spec, status, says):
    llmd["spec"] = _merged(llmd["spec"], spec)
    with pytest.raises(ApiError) as refused:
        create(setup.api, llmd)
    assert refused.value.status == status and says in str(refused.value), refused.value
    assert read(setup.api, llmd) is None


def test_a_spec_only_the_operator_refuses_applies_nothing_and_says_why(setup, llmd):
    api = setup.api
    llmd["spec"]["decode"] = {"podTemplate": {"volumeMounts": [
        {"name": "not-a-volume", "mountPath": "/extra"}]}}  # fmt: skip
    create(api, llmd)
    live = wait_condition(api, llmd, "SpecValid", "False")
    message = condition(live, "SpecValid")["message"]
    assert "spec.decode.podTemplate.volumeMounts" in message, message
    warnings = [e for e in events(api, live) if e["type"] == "Warning"]
    assert [e["reason"] for e in warnings] == ["InvalidSpec"] and warnings[0]["message"] == message
    assert all(get_child(api, obj) is None for obj in _children_if_valid(live))


def _children_if_valid(live: dict) -> list[dict]:
    valid = {**live, "spec": {k: v for k, v in live["spec"].items() if k != "decode"}}
    return expected_children(valid)


def _template_revision(setup, llmd: dict, role: str) -> str:
    name = f"{llmd['metadata']['name']}-{role}"
    deployment = setup.api.get(DEPLOYMENT, setup.watched, name)
    return deployment["spec"]["template"]["metadata"]["labels"][REVISION_LABEL]


def _deployments_settled(setup, live: dict) -> bool:
    """Every Deployment has created all its pods and its status says so."""
    for obj in expected_children(live):
        if obj["kind"] != "Deployment":
            continue
        found = get_child(setup.api, obj) or {}
        status, wanted = found.get("status") or {}, obj["spec"]["replicas"]
        if status.get("observedGeneration") != found["metadata"]["generation"]:
            return False
        if (status.get("replicas"), status.get("updatedReplicas")) != (wanted, wanted):
            return False
    return True


def _wait_for_resyncs(operator, count: int) -> None:
    def timers() -> float:
        return operator.counter("tandem_operator_reconciles_total", trigger="timer")

    start = timers()
    assert wait_until(lambda: timers() >= start + count, timeout=HANG_S)


def _merged(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merged(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


@pytest.mark.parametrize("name", ["minimal", "full", "tensor-parallel"])
def test_each_example_and_every_child_it_renders_pass_a_server_dry_run(setup, name):
    """Server-side apply with dryRun=All: the real schemas, defaults and admission, with no
    409 for names that already exist and nothing left behind."""
    llmd = llmd_from(f"dry-{name}", setup.watched, name)
    _dry_apply(setup.api, LLM_DEPLOYMENT.path(setup.watched, llmd["metadata"]["name"]), llmd)
    rendered = expected_children({**llmd, "metadata": {**llmd["metadata"], "uid": "0" * 36}})
    for obj in rendered:
        if child_kind(obj).group in OPTIONAL_GROUPS:  # skipped by the operator when unserved
            continue
        meta = obj["metadata"]
        _dry_apply(setup.api, child_kind(obj).path(meta["namespace"], meta["name"]), obj)
    assert read(setup.api, llmd) is None


def _dry_apply(api, path: str, obj: dict) -> None:
    query = [("fieldManager", "tandem-e2e"), ("force", "true"), ("dryRun", "All")]
    api._call("PATCH", path, query, obj, "application/apply-patch+yaml")


def test_the_server_publishes_a_description_for_every_spec_field(setup):
    """What `kubectl explain llmd.spec...` prints: the OpenAPI v3 the server serves."""
    path = "/apis/tandem.dev/v1alpha1"
    # the server publishes a new CRD's schema a moment after it is established
    published = lambda: path[1:] in setup.api._call("GET", "/openapi/v3")["paths"]  # noqa: E731
    assert wait_until(published, timeout=HANG_S)
    document = setup.api._call("GET", f"/openapi/v3{path}")
    schemas = document["components"]["schemas"]
    (name,) = [n for n in schemas if n.endswith("tandem.v1alpha1.LLMDeployment")]  # dev.tandem
    missing = list(_undescribed(schemas[name]["properties"]["spec"], "spec"))
    assert missing == []


def _undescribed(node: dict, path: str, is_field: bool = True):
    """Fields without a description; array items and map values are not fields of their
    own (explain prints the array's description), but their properties are."""
    if is_field and not node.get("description"):
        yield path
    for key, child in (node.get("properties") or {}).items():
        yield from _undescribed(child, f"{path}.{key}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from _undescribed(node[key], f"{path}[]", is_field=False)


def test_a_model_cache_is_claimed_and_downloaded_once_before_any_workload(setup, llmd):
    """No kubelet here, so the download Job never runs: the claim and the Job exist (both
    admitted under "restricted"), every serving Deployment is held back, and the status
    says the model is downloading."""
    api = setup.api
    llmd["spec"]["model"] = {
        "name": "tiny",
        "source": {"huggingFace": {"repo": "org/tiny", "revision": "main"}},
        "cache": {"pvc": {"size": "1Gi", "accessModes": ["ReadWriteOnce"]}},
    }
    create(api, llmd)
    live = wait_condition(api, llmd, "ModelCached", "False")
    assert condition(live, "ModelCached")["reason"] == "Downloading"
    cache = live["status"]["modelCache"]
    assert api.get(PVC, setup.watched, cache["claimName"]) is not None
    job = api.get(JOB, setup.watched, cache["jobName"])
    assert (
        job is not None and job["metadata"]["ownerReferences"][0]["uid"] == live["metadata"]["uid"]
    )
    name = llmd["metadata"]["name"]
    for role in ("router", "prefill", "decode"):
        assert api.get(DEPLOYMENT, setup.watched, f"{name}-{role}") is None, role
    selector = f"job-name={cache['jobName']}"
    assert wait_until(lambda: pods(api, setup.watched, selector), timeout=HANG_S)  # admitted
