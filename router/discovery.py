"""Where the workers are: a static list from flags, or Kubernetes EndpointSlices.

In a cluster the operator gives each role a Service labelled `tandem.dev/role`; the
EndpointSlice controller copies those labels onto the slices, so one label selector (say
`tandem.dev/deployment=my-llm`) finds every worker, and the slice says which role it
serves. A worker is its ready address plus the slice's port named `http`; everything
else (revision, ZMQ ports, agent) comes from the worker's own `/health`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tandem.engine.api.kube_config import load_configuration
from tandem.router.workers import WorkerAddress

logger = logging.getLogger(__name__)

ROLE_LABEL = "tandem.dev/role"
HTTP_PORT_NAME = "http"
_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class StaticDiscovery:
    def __init__(self, prefill_urls: Iterable[str], decode_urls: Iterable[str]) -> None:
        self._addresses = [WorkerAddress(u.rstrip("/"), "prefill") for u in prefill_urls] + [
            WorkerAddress(u.rstrip("/"), "decode") for u in decode_urls
        ]

    async def addresses(self) -> list[WorkerAddress]:
        return list(self._addresses)


def workers_from_endpoint_slices(slices: Iterable[dict[str, Any]]) -> list[WorkerAddress]:
    """Ready workers in EndpointSlice objects (API JSON, camelCase), sorted and deduplicated.

    Slices without a role label or an `http` port are skipped; so are endpoints that are
    not ready or are terminating (an absent `ready` means ready, as Kubernetes says).
    """
    found: set[WorkerAddress] = set()
    for item in slices:
        role = (item.get("metadata", {}).get("labels") or {}).get(ROLE_LABEL)
        port = next(
            (p.get("port") for p in item.get("ports") or [] if p.get("name") == HTTP_PORT_NAME),
            None,
        )
        if role not in ("prefill", "decode") or port is None:
            continue
        ipv6 = item.get("addressType") == "IPv6"
        for endpoint in item.get("endpoints") or []:
            conditions = endpoint.get("conditions") or {}
            if conditions.get("ready") is False or conditions.get("terminating") is True:
                continue
            for address in endpoint.get("addresses") or []:
                host = f"[{address}]" if ipv6 else address
                found.add(WorkerAddress(f"http://{host}:{port}", role))
    return sorted(found, key=lambda a: (a.role, a.url))


class EndpointSliceDiscovery:
    """Lists the selected EndpointSlices through the Kubernetes API, at most every
    `refresh_s` (the last good answer is kept when the API fails)."""

    def __init__(self, selector: str, namespace: str | None = None, refresh_s: float = 5.0) -> None:
        from kubernetes import client

        self.api = client.DiscoveryV1Api(client.ApiClient(load_configuration()))
        self.selector = selector
        self.namespace = namespace or _default_namespace()
        self.refresh_s = refresh_s
        self._cached: list[WorkerAddress] = []
        self._fetched = float("-inf")

    async def addresses(self) -> list[WorkerAddress]:
        if time.monotonic() - self._fetched >= self.refresh_s:
            try:
                self._cached = await asyncio.to_thread(self._list)
                self._fetched = time.monotonic()
            except Exception as exc:  # the API server being away must not stop routing
                logger.warning("listing EndpointSlices failed: %s", exc)
        return list(self._cached)

    def _list(self) -> list[WorkerAddress]:
        result = self.api.list_namespaced_endpoint_slice(
            self.namespace, label_selector=self.selector
        )
        items = self.api.api_client.sanitize_for_serialization(result).get("items", [])
        return workers_from_endpoint_slices(items)


def _default_namespace() -> str:
    if _NAMESPACE_FILE.is_file():
        return _NAMESPACE_FILE.read_text().strip()
    return "default"
