"""`spec.slo`: the latency objective the SLO planner sizes the prefill and decode pools to,
read once.

The planner (`tandem planner`, a Deployment of its own: planner_workload.py) replays the
measured traffic through the simulator every `interval` and sets the replicas of each pool
it has bounds for, between `minReplicas` and `maxReplicas`, so that `attainment` of the
requests meet both their time-to-first-token (`ttftMs`) and time-per-output-token (`tpotMs`)
targets. It scales a pool down only once the smaller size has held for `scaleDownWindow`,
and changes nothing for `cooldown` after a change. A pool has one owner of its count: the
planner or `spec.autoscaling.<pool>`'s HPA, never both.

With `remotePrefillThresholds` the planner also chooses the decode pool's remote-prefill
threshold among them and writes its choice to `status.planner.remotePrefillThreshold`; the
operator renders that in place of `spec.disaggregation.remotePrefillThreshold`
(`running_threshold`), which rolls the decode pods.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tandem.operator.reader import Reader

PLANNED_ROLES = ("prefill", "decode")
# prefill may plan down to no pool (decode prefills locally); decode serves every request
MIN_REPLICAS = {"prefill": 0, "decode": 1}
MAX_REPLICAS = 1000
PROFILES = ("h100", "h200", "cpu")  # the simulator's shipped hardware profiles
DURATION = r"[0-9]+(ms|s|m|h)"
UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
MIN_INTERVAL_S = 5.0  # a replay of the traffic window per pass: not a busy loop
MAX_THRESHOLDS = 8  # each is a search of its own per pass


@dataclass(frozen=True)
class PoolBounds:
    min_replicas: int
    max_replicas: int


@dataclass(frozen=True)
class SLOSpec:
    """Targets in seconds; `prefill`/`decode` None where the planner leaves the pool alone.
    `profile` names a shipped simulator profile, `model` a shipped shape or a path in the
    planner's pod; None: the planner's own choice."""

    ttft_s: float
    tpot_s: float
    attainment: float = 0.9
    interval_s: float = 30.0
    scale_down_window_s: float = 300.0
    cooldown_s: float = 60.0
    prefill: PoolBounds | None = None
    decode: PoolBounds | None = None
    profile: str | None = None
    model: str | None = None
    remote_prefill_thresholds: tuple[int, ...] = ()

    def bounds(self, role: str) -> PoolBounds | None:
        """The bounds of `role`'s pool; None for the router and for a pool not planned."""
        return {"prefill": self.prefill, "decode": self.decode}.get(role)


def read_slo(spec: Reader) -> SLOSpec | None:
    """`spec.slo` of the resource's `spec`, None without one. Raises ValueError naming the
    first refused field, among them a pool also scaled by `spec.autoscaling`."""
    if not spec.has("slo"):
        return None
    slo = spec.child("slo")
    simulator = slo.child("simulator")
    parsed = SLOSpec(
        ttft_s=slo.number("ttftMs", required=True, above=0.0) / 1000,
        tpot_s=slo.number("tpotMs", required=True, above=0.0) / 1000,
        attainment=slo.number("attainment", default=0.9, above=0.0, maximum=1.0),
        interval_s=_seconds(slo, "interval", "30s", MIN_INTERVAL_S),
        scale_down_window_s=_seconds(slo, "scaleDownWindow", "300s", 0.0),
        cooldown_s=_seconds(slo, "cooldown", "60s", 0.0),
        prefill=_bounds(slo, "prefill"),
        decode=_bounds(slo, "decode"),
        profile=simulator.string("profile", default=None, choices=PROFILES),
        model=simulator.string("model", default=None, min_length=1),
        remote_prefill_thresholds=_thresholds(slo),
    )
    if parsed.prefill is None and parsed.decode is None:
        raise slo.error("give the bounds of the pools to plan: prefill, decode or both")
    _check_one_owner(slo, spec.child("autoscaling"))
    return parsed


def running_threshold(slo: SLOSpec | None, status: Mapping[str, Any] | None, declared: int) -> int:
    """The decode pool's remote-prefill threshold: the planner's choice in
    `status.planner.remotePrefillThreshold` where `spec.slo` lets it choose and the choice is
    one it may make, else `declared` (`spec.disaggregation`'s)."""
    if slo is None or not slo.remote_prefill_thresholds:
        return declared
    chosen = ((status or {}).get("planner") or {}).get("remotePrefillThreshold")
    allowed = (declared, *slo.remote_prefill_thresholds)
    return chosen if type(chosen) is int and chosen in allowed else declared


def duration_s(text: str) -> float:
    """A duration as the CRD writes it ("30s", "2m", "500ms") in seconds."""
    number, unit = re.fullmatch(r"([0-9]+)(ms|s|m|h)", text).groups()
    return int(number) * UNIT_S[unit]


def _seconds(slo: Reader, key: str, default: str, minimum_s: float) -> float:
    text = slo.string(key, default=default, pattern=DURATION)
    if duration_s(text) < minimum_s:
        raise slo.error(f"must be at least {minimum_s:g}s, got {text!r}", key)
    return duration_s(text)


def _thresholds(slo: Reader) -> tuple[int, ...]:
    values = slo.sequence("remotePrefillThresholds")
    if len(values) > MAX_THRESHOLDS:
        raise slo.error(
            f"at most {MAX_THRESHOLDS} thresholds, got {len(values)}", "remotePrefillThresholds"
        )
    for value in values:
        if type(value) is not int or value < 0:
            raise slo.error(
                f"thresholds are integers >= 0, got {value!r}", "remotePrefillThresholds"
            )
    if len(set(values)) != len(values):
        raise slo.error("thresholds must differ", "remotePrefillThresholds")
    return tuple(sorted(values))


def _bounds(slo: Reader, role: str) -> PoolBounds | None:
    if not slo.has(role):
        return None
    pool = slo.child(role)
    least = MIN_REPLICAS[role]
    bounds = PoolBounds(
        min_replicas=pool.integer(
            "minReplicas", default=least, minimum=least, maximum=MAX_REPLICAS
        ),
        max_replicas=pool.integer("maxReplicas", required=True, minimum=1, maximum=MAX_REPLICAS),
    )
    if bounds.min_replicas > bounds.max_replicas:
        raise pool.error("minReplicas must not exceed maxReplicas")
    return bounds


def _check_one_owner(slo: Reader, autoscaling: Reader) -> None:
    """A pool's count belongs to the planner or to an HPA: two owners would undo each
    other's changes."""
    for role in PLANNED_ROLES:
        if slo.has(role) and autoscaling.has(role):
            raise slo.error(
                f"the {role} pool is scaled by {autoscaling.path}.{role} already: choose one",
                role,
            )
