"""Reading and writing LLMDeployments and their children in the e2e tests, as the
administrator."""

from __future__ import annotations

import copy
from typing import Any

from tandem.operator.kinds import EVENT, LLM_DEPLOYMENT, POD, Kind, child_kind
from tandem.operator.kube import ApiError, KubeApi
from tandem.operator.render import render
from tests.disagg.nodes import wait_until
from tests.operator.crd_schema import example

# A bound that only a hang reaches: the operator reconciles within seconds.
HANG_S = 180
MERGE = "application/merge-patch+json"


def llmd_from(name: str, namespace: str, example_name: str = "minimal") -> dict[str, Any]:
    llmd = example(example_name)
    del llmd["metadata"]["uid"]
    llmd["metadata"] = {"name": name, "namespace": namespace}
    return llmd


def create(api: KubeApi, llmd: dict[str, Any]) -> dict[str, Any]:
    """POST as `kubectl create` does (strict field validation); raises ApiError."""
    path = LLM_DEPLOYMENT.path(llmd["metadata"]["namespace"])
    return api._call("POST", path, [("fieldValidation", "Strict")], llmd)


def patch_spec(api: KubeApi, llmd: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """A JSON merge patch of the spec (None deletes a key)."""
    meta = llmd["metadata"]
    path = LLM_DEPLOYMENT.path(meta["namespace"], meta["name"])
    return api._call("PATCH", path, [("fieldValidation", "Strict")], {"spec": spec}, MERGE)


def read(api: KubeApi, llmd: dict[str, Any]) -> dict[str, Any] | None:
    return api.get(LLM_DEPLOYMENT, llmd["metadata"]["namespace"], llmd["metadata"]["name"])


def delete(api: KubeApi, llmd: dict[str, Any]) -> None:
    meta = llmd["metadata"]
    try:
        api._call("DELETE", LLM_DEPLOYMENT.path(meta["namespace"], meta["name"]))
    except ApiError as exc:
        if exc.status != 404:
            raise


def expected_children(live: dict[str, Any]) -> list[dict[str, Any]]:
    """What the operator should have applied for the live resource (its uid included)."""
    return render(copy.deepcopy(live))


def get_child(api: KubeApi, obj: dict[str, Any]) -> dict[str, Any] | None:
    meta = obj["metadata"]
    return api.get(child_kind(obj), meta["namespace"], meta["name"])


def all_children_exist(api: KubeApi, live: dict[str, Any]) -> bool:
    return all(get_child(api, obj) is not None for obj in expected_children(live))


def condition(live: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    conditions = ((live or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), None)


def wait_condition(api: KubeApi, llmd: dict[str, Any], kind: str, status: str) -> dict:
    """The live resource once its `kind` condition has `status` for its current spec."""

    def settled() -> bool:
        live = read(api, llmd) or {}
        found = condition(live, kind)
        observed = (live.get("status") or {}).get("observedGeneration")
        return (
            found is not None
            and found["status"] == status
            and (observed == live["metadata"]["generation"])
        )

    assert wait_until(settled, timeout=HANG_S), (kind, status, read(api, llmd))
    return read(api, llmd)


def events(api: KubeApi, live: dict[str, Any]) -> list[dict[str, Any]]:
    meta = live["metadata"]
    selector = f"involvedObject.uid={meta['uid']}"
    body = api._call("GET", EVENT.path(meta["namespace"]), [("fieldSelector", selector)])
    return body.get("items") or []


def resource_versions(api: KubeApi, live: dict[str, Any]) -> dict[str, str]:
    """Every child's resourceVersion, by kind/name."""
    found = {}
    for obj in expected_children(live):
        child = get_child(api, obj)
        assert child is not None, obj["metadata"]["name"]
        found[f"{obj['kind']}/{obj['metadata']['name']}"] = child["metadata"]["resourceVersion"]
    return found


def pods(api: KubeApi, namespace: str, selector: str) -> list[dict[str, Any]]:
    return api.list(POD, namespace, selector)


def list_kind(api: KubeApi, kind: Kind, namespace: str, selector: str) -> list[dict]:
    return api.list(kind, namespace, selector)
