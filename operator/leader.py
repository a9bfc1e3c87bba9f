"""Leader election on a coordination.k8s.io Lease, as controller-runtime does it: replicas
wait until the lease is free or expired, the leader renews it, and a leader that cannot
renew within the lease duration stops (its pod restarts as a standby). Two operator
replicas therefore never reconcile at the same time."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tandem.operator.kinds import LEASE
from tandem.operator.kube import ApiError, KubeApi

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseState:
    holder: str
    renewed_at: float  # epoch seconds
    duration_s: float


def may_take(lease: LeaseState | None, identity: str, now: float) -> bool:
    """Whether `identity` may write itself into the lease: it is ours, free or expired."""
    if lease is None or not lease.holder or lease.holder == identity:
        return True
    return now >= lease.renewed_at + lease.duration_s


class LeaderElector:
    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        name: str,
        identity: str,
        duration_s: float = 15.0,
        renew_s: float = 5.0,
        clock: Callable[[], float] = time.time,
        retry_s: float = 2.0,
    ) -> None:
        """A leader renews every `renew_s` and is replaced `duration_s` after its last
        renewal; a standby retries every `retry_s` (controller-runtime's RetryPeriod), so it
        takes a released lease within that."""
        self.api, self.namespace, self.name, self.identity = api, namespace, name, identity
        self.duration_s, self.renew_s, self.clock = duration_s, renew_s, clock
        self.retry_s = min(retry_s, renew_s)

    def try_acquire(self) -> bool:
        """One attempt to take or renew the lease; False when another holder has it or
        the write lost a race (409)."""
        current = self.api.get(LEASE, self.namespace, self.name)
        now = self.clock()
        if current is not None and not may_take(_state(current), self.identity, now):
            return False
        try:
            if current is None:
                self.api.create(LEASE, self.namespace, self._lease(None, now))
            else:
                self.api.replace(LEASE, self.namespace, self._lease(current, now))
        except ApiError as exc:
            if exc.status == 409:
                return False
            raise
        return True

    def wait_until_leader(self, stop: threading.Event) -> bool:
        """Block until leading (True) or `stop` is set (False)."""
        logger.info("waiting for lease %s/%s as %s", self.namespace, self.name, self.identity)
        while not stop.is_set():
            if self._attempt():
                logger.info("leading as %s", self.identity)
                return True
            stop.wait(self.retry_s)
        return False

    def keep_leading(self, stop: threading.Event, on_lost: Callable[[], None]) -> None:
        """Renew until `stop`; call `on_lost` once renewing failed for a lease duration."""
        last = self.clock()
        while not stop.wait(self.renew_s):
            if self._attempt():
                last = self.clock()
            elif self.clock() - last >= self.duration_s:
                logger.error("lost lease %s/%s", self.namespace, self.name)
                on_lost()
                return

    def release(self) -> None:
        """Give the lease up on a clean stop, so a standby need not wait for it to expire
        (controller-runtime's ReleaseOnCancel). Best effort: errors are logged."""
        try:
            current = self.api.get(LEASE, self.namespace, self.name)
            if current is None or _state(current).holder != self.identity:
                return
            released = self._lease(current, self.clock())
            released["spec"]["holderIdentity"] = ""
            self.api.replace(LEASE, self.namespace, released)
            logger.info("released lease %s/%s", self.namespace, self.name)
        except ApiError as exc:
            logger.warning("lease %s/%s not released: %s", self.namespace, self.name, exc)

    def _attempt(self) -> bool:
        try:
            return self.try_acquire()
        except ApiError as exc:
            logger.warning("lease %s/%s: %s", self.namespace, self.name, exc)
            return False

    def _lease(self, current: dict[str, Any] | None, now: float) -> dict[str, Any]:
        spec = dict((current or {}).get("spec") or {})
        if spec.get("holderIdentity") != self.identity:
            spec["acquireTime"] = _micro_time(now)
            spec["leaseTransitions"] = spec.get("leaseTransitions", -1) + 1
        spec |= {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.duration_s),
            "renewTime": _micro_time(now),
        }
        metadata = {"name": self.name, "namespace": self.namespace}
        if current is not None:
            metadata["resourceVersion"] = current["metadata"]["resourceVersion"]
        return {"apiVersion": LEASE.api_version, "kind": "Lease", "metadata": metadata,
                "spec": spec}  # fmt: skip


def _state(lease: dict[str, Any]) -> LeaseState:
    spec = lease.get("spec") or {}
    renewed = spec.get("renewTime")
    renewed_at = _parse_time(renewed) if renewed else 0.0
    return LeaseState(spec.get("holderIdentity", ""), renewed_at,
                      float(spec.get("leaseDurationSeconds", 15)))  # fmt: skip


def _micro_time(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
