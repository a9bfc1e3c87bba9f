"""`spec.autoscaling.<role>`: the HorizontalPodAutoscaler of one role, read once.

A role autoscales as soon as it names `maxReplicas`; `target` is optional, as in an HPA
without metrics. Each role's default target is the signal that says its pods are full:

- router: cpu at 80% of its request, the HPA's own default. The router is a CPU-bound
  proxy with no queue and no KV cache; utilization is a fraction of the cpu request, so the
  router must request cpu (or set a cpu limit, which Kubernetes copies into the request).
- prefill: 4 requests waiting per pod. A prefill pod's work is its queue of prompts: every
  prompt waiting adds a prefill to time-to-first-token. CPU says nothing about GPU pods.
- decode: 80% of the KV cache in use per pod. Decoding is bounded by KV memory; past it,
  requests queue and running ones are preempted. A ratio, so the default suits any model
  and GPU.

The Tandem metrics reach the HPA through a custom-metrics adapter (prometheus-adapter).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tandem.operator.reader import Reader

SCALING_METRICS = ("cpu", "requestsWaiting", "requestsRunning", "kvCacheUsage")
# The router has no queue or KV cache of its own: it scales on cpu or requests in flight.
ROLE_SCALING_METRICS = {
    "router": ("cpu", "requestsRunning"),
    "prefill": SCALING_METRICS,
    "decode": SCALING_METRICS,
}
DEFAULT_TARGETS = {
    "router": ("cpu", 80.0),
    "prefill": ("requestsWaiting", 4.0),
    "decode": ("kvCacheUsage", 0.8),
}


@dataclass(frozen=True)
class Scaling:
    min_replicas: int
    max_replicas: int
    metric: str
    value: float


def read_scaling(autoscaling: Reader, role: str, resources: dict[str, Any]) -> Scaling | None:
    """`autoscaling.<role>`, or None when the role does not autoscale. `resources` are the
    role's container resources: a cpu target needs a cpu request. Raises ValueError."""
    if not autoscaling.has(role):
        return None
    body = autoscaling.child(role)
    metric, value = _target(body.child("target"), role)
    scaling = Scaling(
        min_replicas=body.integer("minReplicas", default=1, minimum=1),
        max_replicas=body.integer("maxReplicas", required=True, minimum=1, maximum=1000),
        metric=metric,
        value=value,
    )
    if scaling.min_replicas > scaling.max_replicas:
        raise body.error("minReplicas must not exceed maxReplicas")
    if metric == "cpu" and not has_cpu_request(resources):
        default = " (the router's default)" if role == "router" else ""
        raise body.error(
            f"a cpu target{default} is a percentage of the cpu request: set "
            f"spec.{role}.resources.requests.cpu, or another target metric", "target"
        )  # fmt: skip
    return scaling


def has_cpu_request(resources: dict[str, Any]) -> bool:
    """A cpu request, or a cpu limit, which Kubernetes copies into a missing request."""
    return any("cpu" in (resources.get(kind) or {}) for kind in ("requests", "limits"))


def _target(target: Reader, role: str) -> tuple[str, float]:
    if not target.present:
        return DEFAULT_TARGETS[role]
    return (
        target.string("metric", required=True, choices=ROLE_SCALING_METRICS[role]),
        target.number("value", required=True, above=0.0),
    )
