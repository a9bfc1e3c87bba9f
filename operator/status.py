"""The LLMDeployment's status as a pure function of what the reconcile observed: the
Deployments of each role as read back, the model cache's download Job, what the spec
relaxes of the pods' hardening, and the spec's validity. Conditions keep their
`lastTransitionTime` while their status does not change."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tandem.operator.model_cache import CacheProgress
from tandem.operator.names import REVISION_LABEL, child_name

ROLE_ORDER = ("router", "prefill", "decode")
# Conditions a spec that does not parse cannot recompute: kept as they were.
KEPT_WHEN_INVALID = ("HardeningRelaxed", "ModelCached")


@dataclass(frozen=True)
class Observation:
    """What one reconcile saw. `deployments` maps each role the spec wants to its Deployment
    as read (None: not there yet). Without a valid spec, `spec_error` says why and
    `router_url` is empty; `previous` is the status as it was. `relaxed` lists what the
    spec's securityOverrides relax, per role; `cache` is the model download, None without
    a cache."""

    generation: int
    deployments: dict[str, dict[str, Any] | None]
    router_url: str = ""
    spec_error: str | None = None
    previous: dict[str, Any] = field(default_factory=dict)
    relaxed: tuple[str, ...] = ()
    cache: CacheProgress | None = None


@dataclass(frozen=True)
class RoleState:
    desired: int
    replicas: int
    ready: int
    updated: int
    settled: bool  # the Deployment controller has seen the latest template
    failure: str | None  # a Deployment condition saying the rollout is stuck
    complete: bool = False  # the controller reported the rollout done (NewReplicaSetAvailable)

    @property
    def available(self) -> bool:
        return self.ready >= 1 or self.desired == 0

    @property
    def rolled_out(self) -> bool:
        """Only pods of the latest template, and each ready unless the rollout already
        completed (a pod lost afterwards is degradation, not progress)."""
        current = self.settled and self.replicas == self.updated == self.desired
        return current and (self.ready == self.desired or self.complete)


def compute_status(observation: Observation, now: str) -> dict[str, Any]:
    """The full `status` to apply. `now` stamps conditions whose status changes."""
    states = {role: _role_state(d) for role, d in observation.deployments.items()}
    conditions = _conditions(observation, states)
    previous = {c["type"]: c for c in observation.previous.get("conditions") or []}
    status: dict[str, Any] = {
        "phase": _phase(observation, conditions),
        "observedGeneration": observation.generation,
        "conditions": [_stamp(c, previous.get(c["type"]), now) for c in conditions],
    }
    for role in ROLE_ORDER:
        state = states.get(role) or RoleState(0, 0, 0, 0, True, None)
        status[role] = {
            "replicas": state.replicas,
            "readyReplicas": state.ready,
            "updatedReplicas": state.updated,
            "ready": f"{state.ready}/{state.desired}",
        }
    for key, value in (
        ("routerURL", observation.router_url or observation.previous.get("routerURL")),
        ("revision", _active_revision(observation, states)),
        ("modelCache", _model_cache(observation)),
    ):
        if value:
            status[key] = value
    return status


def router_url(name: str, namespace: str, port: int) -> str:
    return f"http://{child_name(name, 'router')}.{namespace}.svc:{port}"


def hardening_message(relaxed: tuple[str, ...]) -> str:
    """The HardeningRelaxed condition's message, also the Warning Event's."""
    if not relaxed:
        return "every pod runs with the hardened defaults"
    return f"securityOverrides relax the hardened defaults: {'; '.join(relaxed)}"


def _role_state(deployment: dict[str, Any] | None) -> RoleState:
    if deployment is None:
        return RoleState(1, 0, 0, 0, False, None)
    status = deployment.get("status") or {}
    generation = deployment.get("metadata", {}).get("generation", 0)
    return RoleState(
        desired=deployment.get("spec", {}).get("replicas", 1),
        replicas=status.get("replicas", 0),
        ready=status.get("readyReplicas", 0),
        updated=status.get("updatedReplicas", 0),
        settled=status.get("observedGeneration", 0) >= generation,
        failure=_failure(status.get("conditions") or []),
        complete=any(
            c.get("type") == "Progressing" and c.get("reason") == "NewReplicaSetAvailable"
            for c in status.get("conditions") or []
        ),
    )


def _failure(conditions: list[dict[str, Any]]) -> str | None:
    for c in conditions:
        stuck = c.get("type") == "Progressing" and c.get("reason") == "ProgressDeadlineExceeded"
        if stuck or (c.get("type") == "ReplicaFailure" and c.get("status") == "True"):
            return c.get("message") or c.get("reason")
    return None


def _conditions(obs: Observation, states: dict[str, RoleState]) -> list[dict[str, str]]:
    missing = [r for r in ROLE_ORDER if r in states and not states[r].available]
    rolling = [r for r in ROLE_ORDER if r in states and not states[r].rolled_out]
    failing = [f"{r}: {s.failure}" for r, s in states.items() if s.failure]
    short = [
        f"{r} {s.ready}/{s.desired} ready" for r, s in states.items()
        if s.settled and s.ready < s.desired and r not in rolling
    ]  # fmt: skip
    if obs.cache is not None and obs.cache.failure is not None:
        failing.append(f"model cache: {obs.cache.failure}")
    return [
        _condition("Ready", not missing, "AllRolesAvailable", "RolesUnavailable",
                   "router and decode serve" if not missing else f"no ready pod: {_join(missing)}"),
        _progressing(rolling, obs.cache),
        _condition("Degraded", bool(failing or short), "PodsFailing", "AsExpected",
                   _join(failing + short) if failing or short else "no failure observed"),
        _condition("SpecValid", obs.spec_error is None, "Valid", "InvalidSpec",
                   obs.spec_error or "the spec renders"),
        *_spec_conditions(obs),
    ]  # fmt: skip


def _progressing(rolling: list[str], cache: CacheProgress | None) -> dict[str, str]:
    """True while a role rolls out or the model downloads; False once the download failed,
    which holds the workloads back."""
    if cache is not None and cache.failure is not None:
        return _condition("Progressing", False, "", "DownloadFailed",
                          "held back: the model download failed")  # fmt: skip
    downloading = cache is not None and not cache.complete
    parts = [f"downloading the model (Job {cache.job_name})"] if downloading else []
    parts += [f"rolling out: {_join(rolling)}"] if rolling else []
    return _condition("Progressing", bool(parts),
                      "DownloadingModel" if downloading else "RollingOut", "RolloutComplete",
                      "; ".join(parts) or "every role is up to date")  # fmt: skip


def _spec_conditions(obs: Observation) -> list[dict[str, str]]:
    """HardeningRelaxed, and ModelCached with a cache: from the spec and the download, or
    as they were while the spec does not parse."""
    if obs.spec_error is not None:
        previous = obs.previous.get("conditions") or []
        return [c for c in previous if c.get("type") in KEPT_WHEN_INVALID]
    conditions = [
        _condition("HardeningRelaxed", bool(obs.relaxed), "SecurityOverrides",
                   "HardenedDefaults", hardening_message(obs.relaxed)),
    ]  # fmt: skip
    if (cache := obs.cache) is not None:
        reason = "DownloadFailed" if cache.failure is not None else "Downloading"
        conditions.append(
            _condition("ModelCached", cache.complete, "Downloaded", reason, cache.describe())
        )
    return conditions


def _model_cache(obs: Observation) -> dict[str, str] | None:
    if obs.spec_error is not None:
        return obs.previous.get("modelCache")
    if obs.cache is None:
        return None
    return {"claimName": obs.cache.claim_name, "jobName": obs.cache.job_name}


def _phase(obs: Observation, conditions: list[dict[str, str]]) -> str:
    state = {c["type"]: c["status"] == "True" for c in conditions}
    if obs.spec_error is not None:
        return "Invalid"
    if state["Degraded"]:
        return "Degraded"
    if state["Progressing"]:
        return "Progressing" if any(obs.deployments.values()) else "Pending"
    return "Ready" if state["Ready"] else "Degraded"


def _active_revision(obs: Observation, states: dict[str, RoleState]) -> str | None:
    """The revision the decode pool fully runs; the previous one while it rolls."""
    decode = obs.deployments.get("decode")
    if decode is not None and states["decode"].rolled_out:
        labels = decode["spec"]["template"]["metadata"].get("labels", {})
        return labels.get(REVISION_LABEL)
    return obs.previous.get("revision")


def _condition(kind: str, ok: bool, yes: str, no: str, message: str) -> dict[str, str]:
    return {"type": kind, "status": "True" if ok else "False", "reason": yes if ok else no,
            "message": message}  # fmt: skip


def _stamp(condition: dict[str, str], before: dict[str, Any] | None, now: str) -> dict[str, Any]:
    unchanged = before is not None and before.get("status") == condition["status"]
    return condition | {"lastTransitionTime": before["lastTransitionTime"] if unchanged else now}


def _join(items: list[str]) -> str:
    return ", ".join(items)
