"""Per-request metrics on the router: where each choice's time went, its lengths and how
it finished (vLLM's per-request histograms; the name mapping is in docs/observability.md).

The decode node puts a remote prefill's breakdown (`timings`) on its first record; the
router adds its own clock. For a disaggregated choice the phases before the first token
add up to its time to first token at the router:

    queue           the decode node: arrival -> blocks reserved (admitted)
    remote_prefill  the prefill node: request received -> first token sampled
    kv_transfer     what the transfer adds after that: the decode node's wait for the
                    notification (sent -> notified) minus `remote_prefill`, so the last
                    write, the notification and the ZMQ hop, and also the request's wait
                    in a busy prefill node's socket until its step ends
    other           the rest of the time to first token: routing, the HTTP hops, retries

and after it `first_decode` (first -> second token at the router) and `decode` (first ->
last token), observed for every choice that produced them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from tandem.engine.telemetry.metrics import LABELS, LATENCY_BUCKETS

TTFT_PHASES = ("queue", "remote_prefill", "kv_transfer", "other")
PHASES = (*TTFT_PHASES, "first_decode", "decode")
LENGTH_BUCKETS = (
    1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000,
)  # fmt: skip


@dataclass
class ChoiceClock:
    """One choice's times at the router (monotonic seconds) and what its last record said.
    Records may carry `received_at` (stamped by the dispatcher as they come off the wire,
    so a buffered choice keeps its real times); otherwise the time they are seen."""

    start: float
    first: float | None = None
    second: float | None = None
    last: float | None = None
    timings: dict[str, float] | None = None
    finish_reason: str | None = None
    usage: dict[str, int] | None = None

    def on_record(self, record: dict[str, Any]) -> None:
        now = record.get("received_at") or time.monotonic()
        if record.get("timings") is not None:
            self.timings = record["timings"]
        if record["token_ids"]:
            if self.first is None:
                self.first = now
            elif self.second is None:
                self.second = now
            self.last = now
        if record["finish_reason"] is not None:
            self.finish_reason = record["finish_reason"]
            self.usage = record.get("usage")

    def tpot(self, num_generated: int) -> float | None:
        """Seconds per output token after the first; None below two tokens."""
        if num_generated < 2 or self.first is None or self.last is None:
            return None
        return (self.last - self.first) / (num_generated - 1)

    def phases(self) -> dict[str, float]:
        """Seconds per phase, for the phases this choice went through."""
        out: dict[str, float] = {}
        if self.first is not None and self.timings is not None:
            t = self.timings
            out["queue"] = t["queue_s"]
            out["remote_prefill"] = t["prefill_s"]
            out["kv_transfer"] = max(0.0, t["remote_s"] - t["prefill_s"])
            done = out["queue"] + t["remote_s"]
            out["other"] = max(0.0, self.first - self.start - done)
        if self.second is not None:
            out["first_decode"] = self.second - self.first
        if self.first is not None and self.finish_reason is not None:
            out["decode"] = self.last - self.first
        return out


class PhaseMetrics:
    """The collectors, registered on the router's registry with its labels."""

    def __init__(self, registry: CollectorRegistry, labels: dict[str, str]) -> None:
        self.registry = registry
        self._labels = labels
        self.phase = Histogram(
            "tandem_request_phase_seconds",
            "Time a request spent in each phase (see tandem.router.phase_metrics).",
            (*LABELS, "phase"), registry=registry, buckets=LATENCY_BUCKETS,
        )  # fmt: skip
        self.prompt_len = Histogram(
            "tandem_request_prompt_tokens", "Prompt length of finished requests.",
            LABELS, registry=registry, buckets=LENGTH_BUCKETS,
        )  # fmt: skip
        self.generation_len = Histogram(
            "tandem_request_generation_tokens", "Generated length of finished requests.",
            LABELS, registry=registry, buckets=LENGTH_BUCKETS,
        )  # fmt: skip
        self.tpot = Histogram(
            "tandem_request_time_per_output_token_seconds",
            "Time per output token after the first, per finished request: (last - first "
            "token) / (generated - 1), as the client sees it; what a TPOT target is about.",
            LABELS, registry=registry, buckets=LATENCY_BUCKETS,
        )  # fmt: skip
        self.finished = Counter(
            "tandem_request_success_total",
            "Requests (choices) ended, by finish reason: stop, length, abort (the client "
            "left), error (failed by the servers).",
            (*LABELS, "finish_reason"), registry=registry,
        )  # fmt: skip

    def observe(self, clock: ChoiceClock, failed: bool = False) -> None:
        """Record one choice that ended: finished, failed, or abandoned (aborted)."""
        for phase, seconds in clock.phases().items():
            self.phase.labels(**self._labels, phase=phase).observe(seconds)
        reason = "error" if failed else clock.finish_reason or "abort"
        self.finished.labels(**self._labels, finish_reason=reason).inc()
        if clock.usage is not None and not failed:
            self.prompt_len.labels(**self._labels).observe(clock.usage.get("prompt_tokens", 0))
            self.generation_len.labels(**self._labels).observe(clock.usage["completion_tokens"])
            if (tpot := clock.tpot(clock.usage["completion_tokens"])) is not None:
                self.tpot.labels(**self._labels).observe(tpot)
