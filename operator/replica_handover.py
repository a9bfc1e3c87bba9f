"""The replica count of a pool the SLO planner or an HPA sizes: its Deployment starts at
the pool's minReplicas, and the operator's server-side apply then never owns the count, so
it never undoes their scaling.

render() leaves `spec.replicas` out of such a pool's Deployment. Applied as it is, that
starts a new Deployment at Kubernetes' default of 1, and drops one the operator applied
with a count before (a fixed pool made planned) to 1: server-side apply removes a field its
only manager stops applying. So, as Kubernetes documents for handing `replicas` to an
autoscaler, while the operator's apply owns the count a second field manager,
HANDOVER_MANAGER, applies the count alone: the live one, or the pool's minReplicas for a
Deployment created now. The operator's apply without the count then leaves it to that
manager, until the planner's or the HPA's first scale (an update of the scale subresource)
takes it. The handover is not forced: where the planner already holds another count, it is refused
(409) and nothing changes.
"""

from __future__ import annotations

import copy
from typing import Any

from tandem.operator.kinds import DEPLOYMENT
from tandem.operator.kube import ApiError, KubeApi
from tandem.operator.names import FIELD_MANAGER

HANDOVER_MANAGER = f"{FIELD_MANAGER}-handover"


def hand_over_replicas(api: KubeApi, deployment: dict[str, Any], min_replicas: int) -> None:
    """Before `deployment` (a planned pool's, rendered without replicas) is applied: create
    it at `min_replicas` where it does not exist, and hand the count to HANDOVER_MANAGER
    while the operator's apply owns it. Raises ApiError, but for a conflict."""
    meta = deployment["metadata"]
    live = api.get(DEPLOYMENT, meta["namespace"], meta["name"])
    if live is None:
        live = api.apply(_with_replicas(deployment, min_replicas))
    if not owns_replicas(live, FIELD_MANAGER):
        return
    try:
        api.apply(_count(deployment, live["spec"]["replicas"]), HANDOVER_MANAGER, force=False)
    except ApiError as exc:
        if exc.status != 409:  # someone else holds another count: the planner has it
            raise


def owns_replicas(deployment: dict[str, Any], manager: str) -> bool:
    """Whether `manager`'s server-side apply holds `spec.replicas` (metadata.managedFields)."""
    return any(
        entry.get("manager") == manager
        and entry.get("operation") == "Apply"
        and "f:replicas" in ((entry.get("fieldsV1") or {}).get("f:spec") or {})
        for entry in deployment["metadata"].get("managedFields") or []
    )


def _with_replicas(deployment: dict[str, Any], replicas: int) -> dict[str, Any]:
    created = copy.deepcopy(deployment)
    created["spec"] = {"replicas": replicas, **created["spec"]}
    return created


def _count(deployment: dict[str, Any], replicas: int) -> dict[str, Any]:
    """The count alone: an apply of it owns nothing else."""
    meta = deployment["metadata"]
    return {
        "apiVersion": deployment["apiVersion"],
        "kind": deployment["kind"],
        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
        "spec": {"replicas": replicas},
    }
