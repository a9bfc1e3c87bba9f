"""The operator's only door to the API server: server-side apply, list, get, delete, status
and events over REST, through the official client's configuration and authentication.

Paths come from `tandem.operator.kinds`, so the verbs used here are exactly the ones the
chart's RBAC grants.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from tandem.engine.api.kube_config import load_configuration
from tandem.operator.kinds import EVENT, LLM_DEPLOYMENT, Kind, child_kind
from tandem.operator.names import FIELD_MANAGER

logger = logging.getLogger(__name__)

APPLY = "application/apply-patch+yaml"  # JSON is YAML: the body is sent as JSON
MERGE_PATCH = "application/merge-patch+json"
# Seconds for one call, connect and read: a reconcile or a probe never hangs on a dead peer.
REQUEST_TIMEOUT_S = 30.0


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


class KubeApi:
    """Synchronous calls; kopf runs the reconcile in a worker thread."""

    def __init__(self, api_client: Any) -> None:
        self.client = api_client

    @classmethod
    def from_environment(cls) -> KubeApi:
        """In-cluster service account, else $KUBECONFIG / ~/.kube/config."""
        from kubernetes import client

        return cls(client.ApiClient(load_configuration()))

    def apply(
        self, obj: dict[str, Any], manager: str = FIELD_MANAGER, force: bool = True
    ) -> dict[str, Any]:
        """Server-side apply, by default under the field manager `tandem-operator` and
        taking over fields another manager set (the operator owns its children). Unforced,
        a field another manager holds at another value is a conflict: ApiError 409."""
        meta = obj["metadata"]
        path = child_kind(obj).path(meta["namespace"], meta["name"])
        query = [("fieldManager", manager)] + ([("force", "true")] if force else [])
        return self._call("PATCH", path, query, obj, APPLY)

    def apply_status(
        self, llmd: dict[str, Any], status: dict[str, Any], manager: str = FIELD_MANAGER
    ) -> dict[str, Any]:
        """Server-side apply of `status` fields as `manager`: fields another manager owns
        (the planner's `status.planner`, the operator's conditions) are left alone."""
        meta = llmd["metadata"]
        path = LLM_DEPLOYMENT.path(meta["namespace"], meta["name"], "status")
        body = {
            "apiVersion": LLM_DEPLOYMENT.api_version,
            "kind": LLM_DEPLOYMENT.kind,
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
            "status": status,
        }
        query = [("fieldManager", manager), ("force", "true")]
        return self._call("PATCH", path, query, body, APPLY)

    def scale(
        self, kind: Kind, namespace: str, name: str, replicas: int | None = None
    ) -> int | None:
        """The replicas of the object's scale subresource, set to `replicas` first when
        given (a merge patch: only that field); None when the object does not exist."""
        path = kind.path(namespace, name, "scale")
        try:
            if replicas is None:
                body = self._call("GET", path)
            else:
                patch = {"spec": {"replicas": replicas}}
                body = self._call("PATCH", path, body=patch, content_type=MERGE_PATCH)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return int(body.get("spec", {}).get("replicas") or 0)

    def get(
        self, kind: Kind, namespace: str, name: str, timeout_s: float = REQUEST_TIMEOUT_S
    ) -> dict[str, Any] | None:
        try:
            return self._call("GET", kind.path(namespace, name), timeout_s=timeout_s)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def list(self, kind: Kind, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        body = self._call("GET", kind.path(namespace), [("labelSelector", label_selector)])
        return body.get("items") or []

    def probe(self, namespace: str | None) -> None:
        """A cheap call with the operator's own credentials and permissions: list at most
        one LLMDeployment (in `namespace`, or everywhere for None). Raises ApiError."""
        path = LLM_DEPLOYMENT.path(namespace) if namespace else LLM_DEPLOYMENT.cluster_path()
        self._call("GET", path, [("limit", "1")])

    def create(
        self, kind: Kind, namespace: str, body: dict[str, Any], timeout_s: float = REQUEST_TIMEOUT_S
    ) -> dict[str, Any]:
        return self._call("POST", kind.path(namespace), body=body, timeout_s=timeout_s)

    def replace(
        self, kind: Kind, namespace: str, body: dict[str, Any], timeout_s: float = REQUEST_TIMEOUT_S
    ) -> dict[str, Any]:
        """PUT with the body's resourceVersion: 409 when someone else wrote first."""
        path = kind.path(namespace, body["metadata"]["name"])
        return self._call("PUT", path, body=body, timeout_s=timeout_s)

    def delete(self, kind: Kind, namespace: str, name: str, uid: str) -> None:
        """Delete that very object (a uid precondition), its dependents in the background."""
        body = {"propagationPolicy": "Background", "preconditions": {"uid": uid}}
        try:
            self._call("DELETE", kind.path(namespace, name), body=body)
        except ApiError as exc:
            if exc.status not in (404, 409):  # already gone, or replaced by a new object
                raise

    def event(
        self,
        llmd: dict[str, Any],
        kind: str,
        reason: str,
        message: str,
        component: str = FIELD_MANAGER,
    ) -> None:
        meta = llmd["metadata"]
        now = utc_now()
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": LLM_DEPLOYMENT.api_version,
                "kind": LLM_DEPLOYMENT.kind,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid", ""),
            },
            "type": kind,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": component},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        self._call("POST", EVENT.path(meta["namespace"]), body=body)

    def _call(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> dict[str, Any]:
        """One call, bounded by `timeout_s` (urllib3's total: connect and read)."""
        headers = {"Accept": "application/json", "Content-Type": content_type}
        _, url, headers, body, _ = self.client.param_serialize(
            method, path, query_params=query or [], header_params=headers, body=body,
            auth_settings=["BearerToken"],
        )  # fmt: skip
        import urllib3
        from kubernetes.client.exceptions import ApiException

        try:
            response = self.client.call_api(method, url, headers, body, _request_timeout=timeout_s)
        except ApiException as exc:  # a TLS failure, or 429 after the client's retries
            raise ApiError(exc.status or 503, str(exc.reason)) from exc
        except urllib3.exceptions.HTTPError as exc:  # refused, reset or timed out
            raise ApiError(503, f"{type(exc).__name__}: {exc}") from exc
        data = response.read() or b"{}"
        if response.status >= 400:
            raise ApiError(response.status, _message(data))
        return json.loads(data)


def utc_now() -> str:
    """Now, as the API server writes timestamps (RFC 3339, seconds, UTC)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _message(data: bytes) -> str:
    try:
        return json.loads(data).get("message", "")
    except (ValueError, AttributeError):
        return data[:200].decode(errors="replace")
