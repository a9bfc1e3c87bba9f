"""Leader election on a coordination.k8s.io Lease, as client-go does it: replicas wait until
the lease is free or expired, the leader renews it, and a leader that cannot renew within
the renew deadline stops (its pod restarts as a standby).

The renew deadline is strictly shorter than the lease duration (client-go's 10 s of 15 s),
every API call of a renewal is bounded by the time left before that deadline, and a
watchdog apart from the renewing thread steps down at the deadline even if a call hangs
past its timeout, so a leader gives up while its last renewal still holds the others off:
the margin (5 s by default, less the watchdog's period `retry_s`) is what separates the old
leader's last act from a standby's first."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tandem.operator.kinds import LEASE
from tandem.operator.kube import REQUEST_TIMEOUT_S, ApiError, KubeApi

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
        renew_deadline_s: float = 10.0,
        clock: Callable[[], float] = time.time,
        retry_s: float = 2.0,
    ) -> None:
        """Others may take the lease `duration_s` after its last renewal; the leader renews
        every `retry_s` and steps down when none succeeded for `renew_deadline_s` (less than
        `duration_s`: ValueError otherwise); a standby retries every `retry_s`
        (client-go's RetryPeriod), so it takes a released lease within that."""
        if not 0 < renew_deadline_s < duration_s:
            raise ValueError(
                f"renew deadline {renew_deadline_s} s must be less than the lease duration "
                f"{duration_s} s"
            )
        self.api, self.namespace, self.name, self.identity = api, namespace, name, identity
        self.duration_s, self.renew_deadline_s, self.clock = duration_s, renew_deadline_s, clock
        self.retry_s = min(retry_s, renew_deadline_s / 2)
        self.renewed_at = -math.inf  # clock time read before the last successful write

    def try_acquire(self, timeout_s: float = REQUEST_TIMEOUT_S, deadline: float = math.inf) -> bool:
        """One attempt to take or renew the lease; False when another holder has it, the
        write lost a race (409), or `deadline` (on `clock`) came first. Each call is bounded
        by `timeout_s` and by the time left before `deadline`."""
        current = self.api.get(
            LEASE, self.namespace, self.name, timeout_s=self._left(timeout_s, deadline)
        )
        now = self.clock()
        if current is not None and not may_take(lease_state(current), self.identity, now):
            return False
        if now >= deadline:
            return False
        timeout_s = self._left(timeout_s, deadline)
        try:
            if current is None:
                self.api.create(LEASE, self.namespace, self._lease(None, now), timeout_s=timeout_s)
            else:
                lease = self._lease(current, now)
                self.api.replace(LEASE, self.namespace, lease, timeout_s=timeout_s)
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
        """Renew every `retry_s` until `stop`, in a thread of its own, while this one
        watches the deadline: once no renewal succeeded within `renew_deadline_s` of the
        last one (`renewed_at`), call `on_lost` and return, even while a renewal call still
        hangs (a DNS lookup, or an HTTP client's retries, outlive any timeout given)."""
        done = threading.Event()  # lost or stopped: the renewing thread ends
        renewer = threading.Thread(target=self._renew, args=(stop, done), daemon=True)
        renewer.start()
        try:
            while not stop.wait(self.retry_s):
                if self.clock() >= self.renewed_at + self.renew_deadline_s:
                    logger.error("lost lease %s/%s: no renewal within %s s", self.namespace,
                                 self.name, self.renew_deadline_s)  # fmt: skip
                    on_lost()
                    return
        finally:
            done.set()

    def _renew(self, stop: threading.Event, done: threading.Event) -> None:
        while not stop.wait(self.retry_s) and not done.is_set():
            deadline = self.renewed_at + self.renew_deadline_s
            if self.clock() < deadline:
                self._attempt(deadline)

    def release(self) -> None:
        """Give the lease up on a clean stop, so a standby need not wait for it to expire
        (controller-runtime's ReleaseOnCancel). Best effort: errors are logged."""
        try:
            current = self.api.get(LEASE, self.namespace, self.name)
            if current is None or lease_state(current).holder != self.identity:
                return
            released = self._lease(current, self.clock())
            released["spec"]["holderIdentity"] = ""
            self.api.replace(LEASE, self.namespace, released)
            logger.info("released lease %s/%s", self.namespace, self.name)
        except ApiError as exc:
            logger.warning("lease %s/%s not released: %s", self.namespace, self.name, exc)

    def _attempt(self, deadline: float = math.inf) -> bool:
        started = self.clock()  # no later than the renewTime the write carries
        try:
            taken = self.try_acquire(deadline=deadline)
        except ApiError as exc:
            logger.warning("lease %s/%s: %s", self.namespace, self.name, exc)
            return False
        if taken:
            self.renewed_at = started
        return taken

    def _left(self, timeout_s: float, deadline: float) -> float:
        """`timeout_s`, or less: the seconds left before `deadline` (a small floor: a call
        with no time at all cannot succeed, and fails at once)."""
        return max(0.001, min(timeout_s, deadline - self.clock()))

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


def lease_state(lease: dict[str, Any]) -> LeaseState:
    spec = lease.get("spec") or {}
    renewed = spec.get("renewTime")
    renewed_at = _parse_time(renewed) if renewed else 0.0
    return LeaseState(spec.get("holderIdentity", ""), renewed_at,
                      float(spec.get("leaseDurationSeconds", 15)))  # fmt: skip


def _micro_time(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
