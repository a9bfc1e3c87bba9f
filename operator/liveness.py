"""Whether the operator can still reach and authenticate to the API server, for `/healthz`.

A thread repeats one cheap call that needs the operator's own credentials and permissions
(listing LLMDeployments, as kopf's watch does). `/healthz` fails once no call has succeeded
for `grace_s`, so a kubelet restarts an operator cut off from its API server. Credentials
refused (401) for `grace_s` are fatal: no retry can fix them, and a restarted pod gets a
freshly projected token.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from tandem.operator.kube import ApiError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Health:
    ok: bool
    detail: str


class ApiLiveness:
    """Owns the record of the last successful and failed checks; `probe()` raises
    ApiError (any status, 503 when unreachable) when the API server refuses or is away."""

    def __init__(
        self,
        probe: Callable[[], None],
        period_s: float = 5.0,
        grace_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.probe, self.period_s, self.grace_s, self.clock = probe, period_s, grace_s, clock
        self.last_ok = clock()  # the grace runs from the start
        self.unauthorized_since: float | None = None
        self.last_error = ""

    def check(self) -> None:
        """One call; records its outcome."""
        try:
            self.probe()
        except ApiError as exc:
            self.last_error = str(exc)
            if exc.status == 401 and self.unauthorized_since is None:
                self.unauthorized_since = self.clock()
            elif exc.status != 401:
                self.unauthorized_since = None
            return
        self.last_ok, self.unauthorized_since, self.last_error = self.clock(), None, ""

    def health(self) -> Health:
        stale = self.clock() - self.last_ok
        if stale <= self.grace_s:
            return Health(True, "ok")
        return Health(False, f"no API server call succeeded for {stale:.0f}s: {self.last_error}")

    def fatal(self) -> str | None:
        """Why the operator must exit, or None."""
        since = self.unauthorized_since
        if since is not None and self.clock() - since >= self.grace_s:
            return f"the API server refuses our credentials: {self.last_error}"
        return None

    def run(self, stop: threading.Event, on_fatal: Callable[[str], None]) -> None:
        """Check every `period_s` until `stop`; call `on_fatal` once, then return."""
        while not stop.wait(self.period_s):
            self.check()
            if not self.health().ok:
                logger.warning("unhealthy: %s", self.health().detail)
            if (reason := self.fatal()) is not None:
                on_fatal(reason)
                return
