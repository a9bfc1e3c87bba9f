"""Which prefill pod served which decode pod, read from the prefill pods' logs while they
live: a prefill node logs `prefill <request>@<attempt> for <decode agent>: received`, and a
decode agent is named `decode-<pod name>-<12 hex digits>`. Each pod's revision is its
`tandem.dev/revision` label. Lines a pod logs after the last read before it is gone are not
seen: the check covers the pairs it read, and says how many."""

from __future__ import annotations

import re
import threading
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException

from tandem.operator.kube import KubeApi
from tests.bounds import HANG_S
from tests.operator.e2e.journey import Served

RECEIVED = re.compile(r"prefill (\S+)@\d+ for decode-(\S+)-[0-9a-f]{12}: received")
REVISION = "tandem.dev/revision"
POLL_S = 1.0


def pod_log(api: KubeApi, namespace: str, name: str) -> str:
    """The pod's log so far; "" once the pod (or its container) is gone."""
    path = f"/api/v1/namespaces/{namespace}/pods/{name}/log"
    _, url, headers, _, _ = api.client.param_serialize(
        "GET", path, header_params={"Accept": "*/*"}, auth_settings=["BearerToken"]
    )
    try:
        response = api.client.call_api("GET", url, headers, _request_timeout=HANG_S)
    except (ApiException, urllib3.exceptions.HTTPError):  # the pod went away meanwhile
        return ""
    return response.read().decode(errors="replace") if response.status == 200 else ""


class Pairings:
    """Reads every second while entered: {request: (prefill pod, decode pod)} and each
    pod's revision."""

    def __init__(self, served: Served) -> None:
        self.served = served
        self.pairs: dict[str, tuple[str, str]] = {}
        self.revisions: dict[str, str] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Pairings:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=HANG_S)

    def mixed(self) -> list[tuple[str, str, str]]:
        """(request, prefill pod, decode pod) whose two pods ran different revisions."""
        return [
            (request, prefill, decode)
            for request, (prefill, decode) in self.pairs.items()
            if self.revisions[prefill] != self.revisions.get(decode, self.revisions[prefill])
        ]

    def served_revisions(self) -> set[str]:
        """The revisions of the prefill pods of the pairs read so far."""
        with self._lock:
            return {self.revisions[prefill] for prefill, _ in self.pairs.values()}

    def unknown(self) -> set[str]:
        """Decode pods named in a prefill log whose revision was never read."""
        return {decode for _, decode in self.pairs.values()} - set(self.revisions)

    def _run(self) -> None:
        while True:
            self.poll()
            if self._stop.wait(POLL_S):
                self.poll()  # the last lines
                return

    def poll(self) -> None:
        s = self.served
        revisions = {
            pod["metadata"]["name"]: pod["metadata"]["labels"][REVISION]
            for role in ("prefill", "decode")
            for pod in s.pods(role)
        }
        pairs = {
            m.group(1): (name, m.group(2))
            for name in (pod["metadata"]["name"] for pod in s.pods("prefill"))
            for m in RECEIVED.finditer(pod_log(s.api, s.namespace, name))
        }
        with self._lock:
            self.revisions.update(revisions)
            self.pairs.update(pairs)
