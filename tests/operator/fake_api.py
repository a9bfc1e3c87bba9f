"""An in-memory stand-in for `KubeApi`, to test the reconcile alone (the real KubeApi is
tested against a real HTTP server in test_kube_api.py). Server-side apply is modelled as
one manager's apply: the applied fields replace the stored ones, metadata.uid stays. Two
fields have managers of their own, as on a real API server: a Deployment's `spec.replicas`
(an apply of the count alone, an update of the scale subresource; Kubernetes' default of 1
once no manager holds it) and the LLMDeployment status's top-level keys (each manager's
status apply: the operator's, the SLO planner's)."""

from __future__ import annotations

import copy
import itertools
import uuid
from typing import Any

from tandem.operator.kinds import Kind, child_kind
from tandem.operator.kube import ApiError
from tandem.operator.names import FIELD_MANAGER

Key = tuple[str, str, str]  # (kind, namespace, name)
SCALER = "tandem-planner"  # who updates a scale subresource here


class FakeApi:
    def __init__(self, missing_groups: frozenset[str] = frozenset()) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}  # (kind, ns, name)
        self.statuses: list[dict[str, Any]] = []  # the operator's status applies
        self.events: list[tuple[str, str, str]] = []
        self.deleted: list[str] = []
        self.listed: list[str] = []  # "<kind> <selector>" of every list call
        self.missing_groups = missing_groups
        self.replica_managers: dict[Key, dict[str, str]] = {}  # manager -> operation
        self.status: dict[str, Any] = {}  # the LLMDeployment's, as stored
        self._status_keys: dict[str, set[str]] = {}  # manager -> keys of its last apply
        self._versions = itertools.count(1)

    def apply(
        self, obj: dict[str, Any], manager: str = FIELD_MANAGER, force: bool = True
    ) -> dict[str, Any]:
        kind = child_kind(obj)
        self._served(kind)
        key = (obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])
        old = self.objects.get(key)
        if old is not None and set(obj.get("spec", {})) == {"replicas"}:  # the count alone
            stored = copy.deepcopy(old)
        else:
            stored = copy.deepcopy(obj)
            stored["metadata"]["uid"] = old["metadata"]["uid"] if old else str(uuid.uuid4())
            if old is not None and "status" in old:
                stored["status"] = old["status"]
        if obj["kind"] == "Deployment":
            self._apply_replicas(key, stored, old, obj["spec"].get("replicas"),
                                 manager, force)  # fmt: skip
        self.objects[key] = stored
        return copy.deepcopy(stored)

    def scale(
        self, kind: Kind, namespace: str, name: str, replicas: int | None = None
    ) -> int | None:
        """KubeApi.scale by SCALER: an update of the count takes it from every other
        manager."""
        obj = self.objects.get((kind.kind, namespace, name))
        if obj is None:
            return None
        if replicas is not None:
            obj["spec"]["replicas"] = replicas
            self.replica_managers[(kind.kind, namespace, name)] = {SCALER: "Update"}
            self._write_managers((kind.kind, namespace, name))
        return obj["spec"]["replicas"]

    def apply_status(
        self, llmd: dict[str, Any], status: dict[str, Any], manager: str = FIELD_MANAGER
    ) -> dict[str, Any]:
        """Keys other managers hold stay; those `manager` applied before and no longer does
        go (unless another manager holds them too)."""
        if manager == FIELD_MANAGER:
            self.statuses.append(copy.deepcopy(status))
        others = set().union(*(k for m, k in self._status_keys.items() if m != manager))
        dropped = self._status_keys.get(manager, set()) - set(status) - others
        kept = {k: v for k, v in self.status.items() if k not in dropped}
        self.status, self._status_keys[manager] = copy.deepcopy(kept | status), set(status)
        llmd["status"] = copy.deepcopy(self.status)  # what the next watch event would carry
        return llmd

    def get(
        self, kind: Kind, namespace: str, name: str, timeout_s: float | None = None
    ) -> dict[str, Any] | None:
        obj = self.objects.get((kind.kind, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def list(self, kind: Kind, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        self._served(kind)
        self.listed.append(f"{kind.kind} {label_selector}")
        wanted = dict(term.split("=") for term in label_selector.split(","))
        return [
            copy.deepcopy(obj) for (k, ns, _), obj in sorted(self.objects.items())
            if k == kind.kind and ns == namespace
            and wanted.items() <= obj["metadata"].get("labels", {}).items()
        ]  # fmt: skip

    def delete(self, kind: Kind, namespace: str, name: str, uid: str) -> None:
        obj = self.objects.get((kind.kind, namespace, name))
        if obj is not None and obj["metadata"]["uid"] == uid:
            del self.objects[(kind.kind, namespace, name)]
            self.deleted.append(f"{kind.kind}/{name}")

    def event(self, llmd: dict[str, Any], kind: str, reason: str, message: str) -> None:
        self.events.append((kind, reason, message))

    @property
    def warnings(self) -> list[tuple[str, str, str]]:
        return [e for e in self.events if e[0] == "Warning"]

    def create(
        self, kind: Kind, namespace: str, body: dict[str, Any], timeout_s: float | None = None
    ) -> dict[str, Any]:
        key = (kind.kind, namespace, body["metadata"]["name"])
        if key in self.objects:
            raise ApiError(409, "already exists")
        return self._store(key, body)

    def replace(
        self, kind: Kind, namespace: str, body: dict[str, Any], timeout_s: float | None = None
    ) -> dict[str, Any]:
        key = (kind.kind, namespace, body["metadata"]["name"])
        current = self.objects.get(key)
        if current is None:
            raise ApiError(404, "not found")
        if current["metadata"]["resourceVersion"] != body["metadata"].get("resourceVersion"):
            raise ApiError(409, "the object has been modified")
        return self._store(key, body)

    def kinds(self, kind: str) -> list[str]:
        return sorted(name for (k, _, name) in self.objects if k == kind)

    def _store(self, key: tuple[str, str, str], body: dict[str, Any]) -> dict[str, Any]:
        stored = copy.deepcopy(body)
        stored["metadata"]["resourceVersion"] = str(next(self._versions))
        self.objects[key] = stored
        return copy.deepcopy(stored)

    def _apply_replicas(
        self,
        key: Key,
        stored: dict[str, Any],
        old: dict[str, Any] | None,
        wanted: int | None,
        manager: str,
        force: bool,
    ) -> None:
        managers = self.replica_managers.setdefault(key, {})
        current = old["spec"].get("replicas") if old is not None else None
        if wanted is None:
            managers.pop(manager, None)
            stored["spec"]["replicas"] = current if managers and current is not None else 1
        else:
            others = set(managers) - {manager}
            if others and wanted != current:
                if not force:
                    raise ApiError(409, f"Apply failed with 1 conflict: conflict with {others}")
                managers.clear()
            managers[manager] = "Apply"
            stored["spec"]["replicas"] = wanted
        self._write_managers(key, stored)

    def _write_managers(self, key: Key, stored: dict[str, Any] | None = None) -> None:
        """metadata.managedFields, for `spec.replicas` alone."""
        obj = stored if stored is not None else self.objects[key]
        obj["metadata"]["managedFields"] = [
            {"manager": manager, "operation": operation, "fieldsType": "FieldsV1",
             "fieldsV1": {"f:spec": {"f:replicas": {}}}}
            for manager, operation in sorted(self.replica_managers[key].items())
        ]  # fmt: skip

    def _served(self, kind: Kind) -> None:
        if kind.group in self.missing_groups:
            raise ApiError(404, f"the server could not find the requested resource ({kind.plural})")
