"""One idempotent reconcile: render, apply, prune, observe, write status.

It is level-based: it never asks what changed, only what should exist, so running it
twice, or after a missed event, or on a timer, converges to the same state. With a model
cache, the serving workloads (Deployments and their HPAs) are held back until the cache's
download Job has completed: no GPU pod waits on a download, and the pods already running
keep serving the previous revision from its own folder of the claim until then. A pool the
SLO planner or an HPA sizes has its replica count handed over before its Deployment is
applied (replica_handover.py). Where `spec.slo` lets the planner choose the decode pool's
remote-prefill threshold, its choice (`status.planner`) is rendered in place of the spec's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from tandem.operator.kinds import CHILD_KINDS, DEPLOYMENT, HPA, JOB, POD, child_kind
from tandem.operator.kube import ApiError, KubeApi, utc_now
from tandem.operator.model_cache import JOB_NAME_LABEL, CacheProgress, claim_name, job_name
from tandem.operator.names import DEPLOYMENT_LABEL, FIELD_MANAGER, ROLE_LABEL, child_name
from tandem.operator.render import active_roles, render_spec
from tandem.operator.replica_handover import hand_over_replicas
from tandem.operator.slo import running_threshold
from tandem.operator.spec import LLMDeploymentSpec, parse
from tandem.operator.status import (
    ROLE_ORDER,
    Observation,
    compute_status,
    hardening_message,
    router_url,
)
from tandem.operator.token_secret import ensure_token_secret

logger = logging.getLogger(__name__)

# Kinds served by an optional add-on: missing from a cluster, they are skipped with an event.
OPTIONAL_GROUPS = {"monitoring.coreos.com"}
# Applied last, and only once the model cache (if any) holds the model.
SERVING_KINDS = {DEPLOYMENT.kind, HPA.kind}


@dataclass
class Outcome:
    """What one reconcile did, for logs, metrics and tests."""

    applied: list[str] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    held: list[str] = field(default_factory=list)  # waiting for the model cache
    spec_error: str | None = None
    status: dict[str, Any] = field(default_factory=dict)


class Reconciler:
    def __init__(self, api: KubeApi, now: Callable[[], str] = utc_now) -> None:
        self.api = api
        self.now = now
        self._warned: dict[str, set[str]] = {}  # uid -> messages already sent as Events
        self._chosen: dict[str, Any] = {}  # uid -> the planner's threshold last rendered

    def reconcile(self, llmd: dict[str, Any]) -> Outcome:
        """Bring the children of `llmd` to what its spec renders and write its status.
        An invalid spec changes no child: it sets SpecValid=False and emits one Event per
        new message. Raises ApiError when the API server refuses a required call."""
        outcome = Outcome()
        chosen = _planner_threshold(llmd)  # read before the status is written
        spec: LLMDeploymentSpec | None = None
        cache: CacheProgress | None = None
        try:
            spec = _with_planned_threshold(parse(llmd), llmd)
        except ValueError as exc:
            outcome.spec_error = str(exc)
            self._report_invalid(llmd, outcome.spec_error)
        else:
            cache = self._converge(llmd, spec, outcome)
            self._note_generation(llmd, outcome)
        observation = self._observe(llmd, spec, outcome.spec_error, cache)
        outcome.status = compute_status(observation, self.now())
        self.api.apply_status(llmd, outcome.status)
        self._chosen[llmd["metadata"].get("uid", "")] = chosen
        return outcome

    def threshold_changed(self, llmd: dict[str, Any]) -> bool:
        """Whether the planner chose another threshold than the one last rendered: a
        change of status, which the spec's handlers do not see."""
        uid = llmd["metadata"].get("uid", "")
        return uid in self._chosen and self._chosen[uid] != _planner_threshold(llmd)

    def _converge(
        self, llmd: dict[str, Any], spec: LLMDeploymentSpec, outcome: Outcome
    ) -> CacheProgress | None:
        """Apply what `spec` renders (the serving workloads once the model is cached),
        prune the rest, and warn about relaxed hardening or a failed download."""
        objects = render_spec(spec)
        if ensure_token_secret(self.api, spec):  # every time: one deleted comes back new
            logger.info("%s/%s: made its token Secret", spec.namespace, spec.name)
        serving = [obj for obj in objects if obj["kind"] in SERVING_KINDS]
        self._apply(llmd, [obj for obj in objects if obj["kind"] not in SERVING_KINDS], outcome)
        cache = self._read_cache(spec)
        if cache is None or cache.complete:
            self._hand_over(spec, serving)
            self._apply(llmd, serving, outcome)
        else:
            outcome.held = [_key(obj) for obj in serving]
        self._prune(llmd, objects, outcome)
        if relaxed := spec.relaxed():
            self._warn_once(llmd, "HardeningRelaxed", hardening_message(relaxed))
        if cache is not None and cache.failure is not None:
            self._warn_once(llmd, "ModelDownloadFailed", cache.describe())
        return cache

    def _hand_over(self, spec: LLMDeploymentSpec, objects: list[dict]) -> None:
        """The replica counts of the pools the SLO planner or an HPA sizes, before their
        Deployments are applied without one."""
        for obj in objects:
            role = obj["metadata"]["labels"].get(ROLE_LABEL, "")
            least = _scaled_minimum(spec, role)
            if obj["kind"] == DEPLOYMENT.kind and least is not None:
                hand_over_replicas(self.api, obj, least)

    def _read_cache(self, spec: LLMDeploymentSpec) -> CacheProgress | None:
        """The download Job as read, with its pods once an attempt failed."""
        if spec.model.cache is None:
            return None
        name = job_name(spec)
        job = self.api.get(JOB, spec.namespace, name)
        pods = []
        if ((job or {}).get("status") or {}).get("failed"):
            pods = self.api.list(POD, spec.namespace, f"{JOB_NAME_LABEL}={name}")
        return CacheProgress(claim_name(spec), name, job, pods)

    def _apply(self, llmd: dict[str, Any], objects: list[dict], outcome: Outcome) -> None:
        for obj in objects:
            try:
                self.api.apply(obj)
                outcome.applied.append(_key(obj))
            except ApiError as exc:
                if exc.status != 404 or child_kind(obj).group not in OPTIONAL_GROUPS:
                    raise
                outcome.skipped.append(_key(obj))
                self._warn_once(llmd, "MissingAPI", f"{obj['kind']} is not served here: {exc}")

    def _prune(self, llmd: dict[str, Any], objects: list[dict], outcome: Outcome) -> None:
        """Delete children this resource controls that render() no longer produces."""
        meta = llmd["metadata"]
        wanted = {_key(obj) for obj in objects}
        selector = f"{DEPLOYMENT_LABEL}={meta['name']},app.kubernetes.io/managed-by={FIELD_MANAGER}"
        for kind in CHILD_KINDS:
            try:
                items = self.api.list(kind, meta["namespace"], selector)
            except ApiError as exc:
                if exc.status == 404 and kind.group in OPTIONAL_GROUPS:
                    continue
                raise
            for item in items:
                key = f"{kind.kind}/{item['metadata']['name']}"
                if key not in wanted and _controlled_by(item, meta.get("uid")):
                    self.api.delete(kind, meta["namespace"], item["metadata"]["name"],
                                    item["metadata"]["uid"])  # fmt: skip
                    outcome.pruned.append(key)

    def _observe(
        self,
        llmd: dict[str, Any],
        spec: LLMDeploymentSpec | None,
        spec_error: str | None,
        cache: CacheProgress | None,
    ) -> Observation:
        meta, previous = llmd["metadata"], llmd.get("status") or {}
        found = {
            role: self.api.get(DEPLOYMENT, meta["namespace"], child_name(meta["name"], role))
            for role in ROLE_ORDER
        }
        if spec is None:  # the spec cannot say what should exist: report what does
            deployments = {r: d for r, d in found.items() if d is not None}
            return Observation(meta.get("generation", 0), deployments, "", spec_error, previous)
        return Observation(
            generation=meta.get("generation", 0),
            deployments={role: found[role] for role in active_roles(spec)},
            router_url=router_url(spec.name, spec.namespace, spec.router.service_port),
            previous=previous,
            relaxed=spec.relaxed(),
            cache=cache,
        )

    def _note_generation(self, llmd: dict[str, Any], outcome: Outcome) -> None:
        """One Normal Event per spec generation brought about (the status's
        observedGeneration tells which were), not one per resync."""
        generation = llmd["metadata"].get("generation", 0)
        if (llmd.get("status") or {}).get("observedGeneration") == generation:
            return
        message = f"generation {generation}: applied {len(outcome.applied)} objects"
        if outcome.pruned:
            message += f", deleted {', '.join(outcome.pruned)}"
        if outcome.held:
            message += f", {len(outcome.held)} held until the model is cached"
        self.api.event(llmd, "Normal", "Reconciled", message)

    def _report_invalid(self, llmd: dict[str, Any], message: str) -> None:
        logger.warning("%s/%s: invalid spec: %s", llmd["metadata"].get("namespace"),
                       llmd["metadata"].get("name"), message)  # fmt: skip
        self._warn_once(llmd, "InvalidSpec", message)

    def _warn_once(self, llmd: dict[str, Any], reason: str, message: str) -> None:
        """An Event unless this message was sent before or the status already reports it
        (the timer would otherwise repeat it every interval)."""
        conditions = (llmd.get("status") or {}).get("conditions") or []
        warned = self._warned.setdefault(llmd["metadata"].get("uid", ""), set())
        if message in warned or any(c.get("message") == message for c in conditions):
            return
        warned.add(message)
        self.api.event(llmd, "Warning", reason, message)

    def forget(self, uid: str) -> None:
        """Drop what was kept for a deleted resource (the warnings it was sent)."""
        self._warned.pop(uid, None)
        self._chosen.pop(uid, None)

    @property
    def num_warned_resources(self) -> int:
        return len(self._warned)


def _scaled_minimum(spec: LLMDeploymentSpec, role: str) -> int | None:
    """The fewest pods of a pool whose count the planner or an HPA owns; None for a pool of
    fixed `replicas` (and the router without an HPA)."""
    if role not in ROLE_ORDER:
        return None
    if (bounds := spec.planned(role)) is not None:
        return bounds.min_replicas
    scaling = spec.pool(role).scaling
    return scaling.min_replicas if scaling is not None else None


def _with_planned_threshold(spec: LLMDeploymentSpec, llmd: dict[str, Any]) -> LLMDeploymentSpec:
    threshold = running_threshold(spec.slo, llmd.get("status"), spec.remote_prefill_threshold)
    return replace(spec, remote_prefill_threshold=threshold)


def _planner_threshold(llmd: dict[str, Any]) -> Any:
    return ((llmd.get("status") or {}).get("planner") or {}).get("remotePrefillThreshold")


def _controlled_by(obj: dict[str, Any], uid: str | None) -> bool:
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return any(ref.get("controller") and ref.get("uid") == uid for ref in refs)


def _key(obj: dict[str, Any]) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"
