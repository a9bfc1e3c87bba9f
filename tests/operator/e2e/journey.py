"""What a user does to put Tandem on a cluster, done on the suite's real node: the chart
installed with Helm (the operator then runs as a pod), a real model on a volume, one
LLMDeployment, and the pods' own timeline read back from the API."""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import httpx
import openai

from tandem.operator.kinds import LLM_DEPLOYMENT, POD, Kind
from tandem.operator.kube import KubeApi
from tandem.operator.spec import DEFAULT_IMAGE
from tests.bounds import HANG_S
from tests.operator.e2e.cluster import CHART, admin_apply
from tests.operator.e2e.node import NODE_NAME

SERVICE = Kind("v1", "Service", "services")
RELEASE = "tandem"
MODEL_FOLDER = "smollm2-135m-instruct"
MODEL_NAME = MODEL_FOLDER  # the id `tandem serve` gives a folder, so both serve one name


def chart_image() -> str:
    """The image the chart and the resource default to (tests/operator/test_image_version.py
    holds them to the chart's appVersion), or $TANDEM_E2E_IMAGE."""
    return os.environ.get("TANDEM_E2E_IMAGE", DEFAULT_IMAGE)


def report(key: str, value) -> None:
    print(f"{key}: {json.dumps(value)}")
    path = os.environ.get("TANDEM_E2E_REPORT")
    if path:
        found = json.loads(Path(path).read_text()) if Path(path).is_file() else {}
        Path(path).write_text(json.dumps(found | {key: value}, indent=1))


CPU_POOL = {"resources": {"limits": {"nvidia.com/gpu": 0}}}  # a node without GPUs


@dataclass
class Served:
    """One LLMDeployment serving SmolLM2 on the node, installed the way a user does."""

    api: KubeApi
    operator_namespace: str
    namespace: str
    name: str
    image: str

    def resource(self) -> dict[str, Any]:
        return self.api.get(LLM_DEPLOYMENT, self.namespace, self.name)

    def pods(self, role: str) -> list[dict[str, Any]]:
        selector = f"tandem.dev/deployment={self.name},tandem.dev/role={role}"
        return self.api.list(POD, self.namespace, selector)

    def current(self, role: str) -> list[dict[str, Any]]:
        """The role's pods that are not terminating."""
        return [p for p in self.pods(role) if not p["metadata"].get("deletionTimestamp")]

    def router_service(self) -> dict[str, Any]:
        return self.api.get(SERVICE, self.namespace, f"{self.name}-router")

    def ref(self) -> dict[str, Any]:
        return {"metadata": {"namespace": self.namespace, "name": self.name}}

    def operator_pods(self) -> list[dict[str, Any]]:
        return self.api.list(POD, self.operator_namespace, "app.kubernetes.io/name=tandem")

    def delete_pod(self, pod: dict[str, Any], grace_s: int | None = None) -> None:
        """As `kubectl delete pod`; `grace_s=0` kills it at once, as a crash would."""
        meta = pod["metadata"]
        body = None if grace_s is None else {"gracePeriodSeconds": grace_s}
        self.api._call("DELETE", POD.path(meta["namespace"], meta["name"]), body=body)

    def ready_ips(self, role: str) -> set[str]:
        """The pod IPs of the role's Ready pods that are not terminating."""
        return {p["status"]["podIP"] for p in self.current(role) if is_ready(p)}

    def router_workers(self, role: str, router: str | None = None) -> set[str]:
        """The IPs of the `role` workers a router (the Service's pick, or the pod at IP
        `router`) counts healthy now."""
        url = f"http://{router}:8000" if router else self.router_url()
        workers = httpx.get(f"{url}/workers", timeout=HANG_S).json()
        return {httpx.URL(w["url"]).host for w in workers if w["role"] == role and w["healthy"]}

    def routers_follow(self, role: str, replicas: int) -> bool:
        """The role has `replicas` Ready pods, and every Ready router uses exactly those."""
        pods = self.ready_ips(role)
        routers = self.ready_ips("router")
        return (
            len(pods) == replicas
            and bool(routers)
            and all(self.router_workers(role, r) == pods for r in routers)
        )

    def rolled_from(self, revision: str) -> bool:
        """A new revision is what every node pod runs, each Ready, one per replica."""
        status = self.resource().get("status") or {}
        now = status.get("revision")
        if now in (None, revision) or status.get("phase") != "Ready":
            return False
        for role in ("prefill", "decode"):
            pods = self.current(role)
            labels = {p["metadata"]["labels"]["tandem.dev/revision"] for p in pods}
            if labels != {now} or not all(is_ready(p) for p in pods):
                return False
        return True

    def router_url(self) -> str:
        """The router's ClusterIP, as a client inside the cluster (or on the node) sees it."""
        spec = self.router_service()["spec"]
        return f"http://{spec['clusterIP']}:{spec['ports'][0]['port']}"


def helm_install(kubeconfig: Path, namespace: str, watched: str, image: str) -> dict[str, Any]:
    """`helm install tandem charts/tandem` by Helm's own engine, waiting for the operator."""
    repository, _, tag = image.rpartition(":")
    values = {
        "watchNamespaces": [watched],
        "resyncInterval": 5,
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
    }
    config = helm.Config(kubeconfig_path=str(kubeconfig), namespace=namespace)
    try:
        release = config.install(
            str(CHART), RELEASE, values, namespace=namespace, create_namespace=True,
            wait="watcher", timeout=600,
        )  # fmt: skip
    finally:
        config.close()
    return release


def helm_uninstall(kubeconfig: Path, namespace: str) -> None:
    config = helm.Config(kubeconfig_path=str(kubeconfig), namespace=namespace)
    try:
        config.uninstall(RELEASE, ignore_not_found=True, timeout=120)
    finally:
        config.close()


def model_volume(api: KubeApi, namespace: str, host_folder: Path) -> str:
    """A PersistentVolume over the node's model folder and a claim bound to it: a pod in a
    namespace that enforces Pod Security "restricted" may mount a claim, not a hostPath."""
    pv = f"tandem-models-{namespace}"
    admin_apply(api, {
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
        "spec": {
            "capacity": {"storage": "2Gi"}, "accessModes": ["ReadOnlyMany"],
            "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
            "hostPath": {"path": str(host_folder), "type": "Directory"},
            "claimRef": {"namespace": namespace, "name": "models"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE_NAME]}]}]}},
        },
    })  # fmt: skip
    admin_apply(api, {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "models", "namespace": namespace},
        "spec": {"accessModes": ["ReadOnlyMany"], "storageClassName": "", "volumeName": pv,
                 "resources": {"requests": {"storage": "2Gi"}}},
    })  # fmt: skip
    return pv


def llm_deployment(name: str, namespace: str, image: str) -> dict[str, Any]:
    return {
        "apiVersion": "tandem.dev/v1alpha1", "kind": "LLMDeployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            # float32: a greedy stream is compared with a greedy reply exactly, and `auto` is
            # bfloat16 on CPUs with AVX512-BF16, where the prefix cache's other path may
            # round them apart at a near-tie
            "model": {"name": MODEL_NAME, "dtype": "float32",
                      "source": {"pvc": {"claimName": "models", "path": MODEL_FOLDER}}},
            "image": image,
            # SmolLM2's template shows no tool-call format: the user names one
            "router": {"toolCallParser": "hermes"},
            "prefill": dict(CPU_POOL), "decode": dict(CPU_POOL),
        },
    }  # fmt: skip


def is_ready(pod: dict[str, Any]) -> bool:
    conditions = pod["status"].get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def pod_timeline(pod: dict[str, Any]) -> dict[str, float]:
    """Seconds from the pod's scheduling to its container's start (image: the container
    created from an image already on the node) and on to Ready (the model loaded and
    /health answering)."""
    status = pod["status"]
    conditions = {c["type"]: _time(c["lastTransitionTime"]) for c in status["conditions"]}
    main = pod["spec"]["containers"][0]["name"]  # the role's own; a podTemplate's come after
    (container,) = [c for c in status["containerStatuses"] if c["name"] == main]
    started = _time(container["state"]["running"]["startedAt"])
    return {
        "image_s": (started - conditions["PodScheduled"]).total_seconds(),
        "ready_s": (conditions["Ready"] - started).total_seconds(),
    }


def _time(stamp: str) -> dt.datetime:
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


@dataclass
class Outcome:
    """How one streamed request ended: `error` is None when it finished with a reason."""

    started: float
    ended: float
    tokens: int
    error: str | None
    retry_after: float = 0.0  # seconds, from a 429 or 503's Retry-After
    first: float | None = None  # when the first token came

    def ttft_s(self) -> float | None:
        return None if self.first is None else self.first - self.started

    def tpot_s(self) -> float | None:
        """The mean gap between tokens after the first (None with fewer than two)."""
        if self.first is None or self.tokens < 2:
            return None
        return (self.ended - self.first) / (self.tokens - 1)


def _error(exc: openai.OpenAIError) -> str:
    return f"{type(exc).__name__}: {exc}"


class StreamLoad:
    """`concurrency` openai clients, each streaming chat completions back to back (or
    `pause_s` apart) until stopped (or `limit` requests in all): a steady load whose every
    request is accounted for."""

    def __init__(
        self, base_url: str, concurrency: int = 8, limit: int = 5000, pause_s: float = 0.0
    ) -> None:
        self.base_url, self.concurrency, self.limit = base_url, concurrency, limit
        self.pause_s = pause_s
        self.outcomes: list[Outcome] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> StreamLoad:
        for i in range(self.concurrency):
            thread = threading.Thread(target=self._client, args=(i,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=HANG_S)

    def count(self) -> int:
        return len(self.outcomes)

    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.error is not None]

    def _client(self, index: int) -> None:
        client = openai.OpenAI(base_url=f"{self.base_url}/v1", api_key="x", timeout=HANG_S,
                               max_retries=0)  # fmt: skip
        while not self._stop.is_set() and len(self.outcomes) < self.limit:
            outcome = self._one(client, index)
            self.outcomes.append(outcome)
            self._stop.wait(max(outcome.retry_after, self.pause_s))  # as told to come back later

    def _one(self, client: openai.OpenAI, index: int) -> Outcome:
        started, tokens, finish, first = time.monotonic(), 0, None, None
        try:
            stream = client.chat.completions.create(
                model=MODEL_NAME, max_tokens=24, stream=True,
                messages=[{"role": "user", "content": f"Count to {index + 3}."}],
            )  # fmt: skip
            for chunk in stream:
                for choice in chunk.choices:
                    if choice.delta.content:
                        tokens += 1
                        first = first or time.monotonic()
                    finish = choice.finish_reason or finish
            error = None if finish else "no finish_reason"
        except openai.APIStatusError as exc:  # 429 and 503 say when to come back
            after = float(exc.response.headers.get("retry-after", 0))
            return Outcome(started, time.monotonic(), tokens, _error(exc), after)
        except openai.OpenAIError as exc:
            error = _error(exc)
        return Outcome(started, time.monotonic(), tokens, error, first=first)
