"""An in-memory stand-in for `KubeApi`, to test the reconcile alone (the real KubeApi is
tested against a real HTTP server in test_kube_api.py). Server-side apply is modelled as
one manager's apply: the applied fields replace the stored ones, metadata.uid stays."""

from __future__ import annotations

import copy
import itertools
import uuid
from typing import Any

from tandem.operator.kinds import Kind, child_kind
from tandem.operator.kube import ApiError


class FakeApi:
    def __init__(self, missing_groups: frozenset[str] = frozenset()) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}  # (kind, ns, name)
        self.statuses: list[dict[str, Any]] = []
        self.events: list[tuple[str, str, str]] = []
        self.deleted: list[str] = []
        self.listed: list[str] = []  # "<kind> <selector>" of every list call
        self.missing_groups = missing_groups
        self._versions = itertools.count(1)

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        kind = child_kind(obj)
        self._served(kind)
        key = (obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])
        stored = copy.deepcopy(obj)
        old = self.objects.get(key)
        stored["metadata"]["uid"] = old["metadata"]["uid"] if old else str(uuid.uuid4())
        if old is not None and "status" in old:
            stored["status"] = old["status"]
        self.objects[key] = stored
        return stored

    def apply_status(self, llmd: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        self.statuses.append(copy.deepcopy(status))
        llmd["status"] = copy.deepcopy(status)  # what the next watch event would carry
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

    def _served(self, kind: Kind) -> None:
        if kind.group in self.missing_groups:
            raise ApiError(404, f"the server could not find the requested resource ({kind.plural})")
