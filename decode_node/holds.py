"""The decode node's KV holds as its operators see them: every hold's release, expiry and
abort logged with its request's id (`log_ids`, kept while the hold lives: it may outlive the
request's stream) and counted. The bookkeeping itself is `PrefillFailover`'s; this class
gives it the wall clock, log lines and metrics."""

from __future__ import annotations

import logging
import time

from tandem.engine.telemetry import request_log
from tandem.engine.transfer.prefill_failover import HoldExpiry, PrefillFailover
from tandem.node.core import NodeCore

logger = logging.getLogger(__name__)

# How a quarantined hold's release is logged, by `tandem_kv_quarantine_releases_total` reason.
RELEASE_DETAIL = {
    "confirmed": "the prefill worker confirmed late",
    "writer_lost": "the connection to its prefill worker was lost",
}


class Holds:
    """Logs and counts what happens to the holds of `failover` on the node `core`."""

    def __init__(self, failover: PrefillFailover, core: NodeCore) -> None:
        self.failover = failover
        self.core = core
        # hold key -> the request's log id, for lines about a hold that outlives its stream
        self.log_ids: dict[str, str] = {}

    def expired(self, expiry: HoldExpiry) -> None:
        """Log and count a hold timeout: quarantined while its writer may still write."""
        key = expiry.key
        with request_log.request_context(self.log_ids.get(key)):
            if not expiry.quarantined:
                logger.warning(
                    "hold %s: no confirmation from the prefill worker, whose connection "
                    "was lost; releasing", key,
                )  # fmt: skip
                self.log_ids.pop(key, None)
                return
            logger.warning(
                "hold %s: no confirmation from the prefill worker; quarantining %d blocks "
                "until %s confirms or its connection drops",
                key, self.core.kv.num_blocks_held(key), expiry.worker,
            )  # fmt: skip
        m = self.core.metrics
        m.child(m.quarantines).inc()

    def send_aborts(self) -> None:
        """Tell prefill workers about abandoned attempts, and again every ABORT_RESEND_S
        while unconfirmed; their blocks stay held until the answer (or the hold timeout)."""
        for hold in self.failover.send_aborts(time.monotonic()):
            with request_log.request_context(self.log_ids.get(hold.key)):
                logger.warning("hold %s: cannot reach %s to abort yet", hold.key, hold.worker)

    def release(self, key: str, reason: str = "confirmed") -> None:
        """Give the hold's blocks back (nothing more lands in them); a quarantined hold's
        release is logged and counted by `reason` (confirmed, writer_lost)."""
        if self.failover.is_quarantined(key):
            with request_log.request_context(self.log_ids.get(key)):
                logger.warning(
                    "hold %s: %s; releasing %d quarantined blocks",
                    key, RELEASE_DETAIL[reason], self.core.kv.num_blocks_held(key),
                )  # fmt: skip
            m = self.core.metrics
            m.child(m.quarantine_releases, reason=reason).inc()
        self.log_ids.pop(key, None)
        self.failover.release(key)
