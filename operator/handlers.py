"""Thin kopf handlers: create, update, resume and a timer all call the one reconcile; a
watch event of a deleted resource drops what the operator kept for it (its lock, the
warnings it sent), so a long-lived operator's memory does not grow with every resource it
ever saw, and one that shows the SLO planner chose another remote-prefill threshold (a
change of status, which kopf's change handlers ignore) reconciles at once. The event
handler adds no finalizer: deletion never waits for the operator.

The handlers live in a registry built here and passed to `kopf.run`, not in kopf's global
default registry, so tests build as many operators as they like. kopf adds its default
login handlers only to that global registry, so this one registers its own
(`tandem.operator.login`).
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import kopf

from tandem.operator.kube import ApiError
from tandem.operator.login import login
from tandem.operator.metrics import OperatorMetrics
from tandem.operator.names import GROUP, PLURAL, VERSION
from tandem.operator.reconcile import Reconciler

RESOURCE = (GROUP, VERSION, PLURAL)
ANNOTATION_PREFIX = "tandem.dev"  # kopf keeps its progress in annotations, not in status
RETRY_DELAY_S = 10.0


class ResourceLocks:
    """One lock per resource uid, made on first use and dropped by `forget`. Thread-safe:
    kopf runs sync handlers in a thread pool."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}

    def __len__(self) -> int:
        return len(self._locks)

    @contextmanager
    def hold(self, uid: str) -> Iterator[None]:
        with self._guard:
            lock = self._locks.setdefault(uid, threading.Lock())
        with lock:
            yield

    def forget(self, uid: str) -> None:
        with self._guard:
            self._locks.pop(uid, None)


def build_registry(
    reconciler: Reconciler,
    metrics: OperatorMetrics,
    interval_s: float = 60.0,
    locks: ResourceLocks | None = None,
) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    locks = locks if locks is not None else ResourceLocks()

    def reconcile(trigger: str, body: kopf.Body) -> None:
        # kopf may run the timer while a change handler runs: one reconcile per object.
        with locks.hold(body.metadata.uid or ""):
            _run(reconciler, metrics, trigger, _plain(body))

    def on_event(type: str, body: kopf.Body, **_: Any) -> None:
        if type == "DELETED":
            uid = body.metadata.uid or ""
            locks.forget(uid)
            reconciler.forget(uid)
        elif type == "MODIFIED" and reconciler.threshold_changed(_plain(body)):
            reconcile("planner", body)  # a status change: the spec's handlers miss it

    def on_change(body: kopf.Body, reason: str, **_: Any) -> None:
        reconcile(str(getattr(reason, "value", reason)), body)

    def on_timer(body: kopf.Body, **_: Any) -> None:
        reconcile("timer", body)

    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
            prefix=ANNOTATION_PREFIX
        )
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=ANNOTATION_PREFIX
        )
        # Resources are scanned once at start; watching CRDs and namespaces would need
        # cluster-wide permissions the operator has no other use for.
        settings.scanning.disabled = True
        settings.posting.level = logging.WARNING  # kopf's warnings and errors become Events

    kopf.on.startup(registry=registry)(configure)
    kopf.on.login(registry=registry)(login)
    for name, decorator in (
        ("create", kopf.on.create),
        ("update", kopf.on.update),
        ("resume", kopf.on.resume),
    ):
        decorator(*RESOURCE, id=f"reconcile-on-{name}", registry=registry)(on_change)
    kopf.on.event(*RESOURCE, id="forget-on-delete", registry=registry)(on_event)
    kopf.timer(*RESOURCE, id="resync", interval=interval_s, idle=interval_s / 2, registry=registry)(
        on_timer
    )
    return registry


def _run(reconciler: Reconciler, metrics: OperatorMetrics, trigger: str, llmd: dict) -> None:
    start = time.perf_counter()
    try:
        outcome = reconciler.reconcile(llmd)
    except ApiError as exc:
        metrics.reconciles.labels(trigger, "error").inc()
        raise kopf.TemporaryError(f"API server refused: {exc}", delay=RETRY_DELAY_S) from exc
    finally:
        metrics.duration.observe(time.perf_counter() - start)
    metrics.reconciles.labels(trigger, "invalid" if outcome.spec_error else "success").inc()
    metrics.applied.inc(len(outcome.applied))
    metrics.pruned.inc(len(outcome.pruned))


def _plain(body: kopf.Body) -> dict[str, Any]:
    """A private copy of kopf's live body, as the plain dict the reconcile expects."""
    return copy.deepcopy(dict(body))
