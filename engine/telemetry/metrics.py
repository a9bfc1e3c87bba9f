"""Prometheus metrics of a prefill or decode node (names from design §7, vLLM's with the
`tandem_` prefix). Each node owns its own registry: no module-level collectors."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

from tandem.engine.core.scheduler import Scheduler, SchedulerOutput
from tandem.engine.telemetry.tier_metrics import TierMetrics

LATENCY_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
LABELS = ("model", "role", "pod")
# The labels of the counters that move only on faults (prefill_node/node.py,
# decode_node/node.py): each starts at 0, so a dashboard shows 0, not "No data".
TRANSFER_FAILURE_REASONS = ("post", "write", "notify")
FALLBACK_REASONS = ("error", "disconnected", "unreachable", "timeout")
DISAGG_DECISIONS = ("local", "remote")
QUARANTINE_RELEASE_REASONS = ("confirmed", "writer_lost")
# What a node refuses (or partly ignores) at its boundary, by role (docs/security.md).
REFUSAL_REASONS = {
    "prefill": ("invalid", "peer", "error", "undecodable", "unpaired", "unauthenticated"),
    "decode": (
        "undecodable",
        "first_token",
        "duplicate_id",
        "unauthenticated",
        "protocol",
        "foreign",
    ),
}
# Why two nodes would not pair (engine.wire.Fingerprint's fields, the token, the role).
PAIRING_REFUSALS = (
    "protocol", "model", "revision", "dtype", "block_size", "kv_layout", "token", "role",
)  # fmt: skip
# Tokens computed in one engine step (vLLM's iteration_tokens_total buckets).
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


class NodeMetrics:
    """Every collector a node exports, bound to its `model`, `role` and `pod` labels."""

    def __init__(self, registry: CollectorRegistry, model: str, role: str, pod: str) -> None:
        self.registry = registry
        self._labels = {"model": model, "role": role, "pod": pod}
        self.ttft = self._histogram("tandem_time_to_first_token_seconds", "Time to first token.")
        self.itl = self._histogram("tandem_inter_token_latency_seconds", "Time between tokens.")
        self.e2e = self._histogram("tandem_e2e_request_latency_seconds", "Request latency.")
        self.queue_time = self._histogram(
            "tandem_request_queue_time_seconds", "Time from arrival to first scheduling."
        )
        self.running = self._gauge("tandem_num_requests_running", "Requests in the batch.")
        self.waiting = self._gauge("tandem_num_requests_waiting", "Requests queued.")
        self.kv_usage = self._gauge("tandem_kv_cache_usage_ratio", "Fraction of KV blocks used.")
        self.prefix_queries = self._counter(
            "tandem_prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache."
        )
        self.prefix_hits = self._counter(
            "tandem_prefix_cache_hits_total", "Prompt tokens found in the prefix cache."
        )
        self.prompt_tokens = self._counter("tandem_prompt_tokens_total", "Prompt tokens.")
        self.generation_tokens = self._counter(
            "tandem_generation_tokens_total", "Generated tokens."
        )
        self.preemptions = self._counter("tandem_num_preemptions_total", "Preemptions.")
        self.request_success = self._counter(
            "tandem_request_success_total", "Finished requests.", ("finish_reason",)
        )
        self.transfer_seconds = self._histogram(
            "tandem_kv_transfer_seconds", "Duration of one KV WRITE, post to completion."
        )
        self.transfer_bytes = self._counter("tandem_kv_transfer_bytes_total", "KV bytes moved.")
        self.transfer_blocks = self._counter("tandem_kv_transfer_blocks_total", "KV blocks moved.")
        self.transfer_failures = self._counter(
            "tandem_kv_transfer_failures_total", "KV transfers that failed.", ("reason",)
        )
        self.disagg_decisions = self._counter(
            "tandem_disagg_decisions_total", "Remote or local prefill decisions.", ("decision",)
        )
        self.prefill_fallbacks = self._counter(
            "tandem_prefill_fallbacks_total", "Remote prefills that failed over.", ("reason",)
        )
        self.kv_quarantined = self._gauge(
            "tandem_kv_quarantined_blocks",
            "KV blocks of abandoned remote prefills whose writer may still write into them.",
        )
        self.quarantines = self._counter(
            "tandem_kv_quarantines_total", "Holds quarantined: their timeout passed unconfirmed."
        )
        self.quarantine_releases = self._counter(
            "tandem_kv_quarantine_releases_total", "Quarantined holds released.", ("reason",)
        )
        self.refused_inputs = self._counter(
            "tandem_refused_inputs_total",
            "Messages and requests a node refused, or partly ignored, at its boundary.",
            ("reason",),
        )
        self.pairings_refused = self._counter(
            "tandem_pairings_refused_total",
            "Prefill-decode pairings refused at first contact, by the field that differed.",
            ("reason",),
        )
        self.iteration_tokens = Histogram(
            "tandem_iteration_tokens_total", "Tokens computed per engine step.",
            LABELS, registry=registry, buckets=ITERATION_BUCKETS,
        )  # fmt: skip
        self.tiers = TierMetrics(registry, self._labels)
        ProcessCollector(registry=registry)  # process_cpu_seconds_total, _resident_memory_bytes
        self._seen_queries = self._seen_hits = self._seen_preemptions = 0
        self._start_at_zero(role)

    def _start_at_zero(self, role: str) -> None:
        """The series a role's faults would make, present at 0 from the start."""
        self.child(self.preemptions)
        for reason in REFUSAL_REASONS.get(role, ()):
            self.child(self.refused_inputs, reason=reason)
        for reason in PAIRING_REFUSALS:
            self.child(self.pairings_refused, reason=reason)
        if role == "prefill":
            for reason in TRANSFER_FAILURE_REASONS:
                self.child(self.transfer_failures, reason=reason)
        if role == "decode":
            for reason in FALLBACK_REASONS:
                self.child(self.prefill_fallbacks, reason=reason)
            for decision in DISAGG_DECISIONS:
                self.child(self.disagg_decisions, decision=decision)
            self.child(self.kv_quarantined)
            self.child(self.quarantines)
            for reason in QUARANTINE_RELEASE_REASONS:
                self.child(self.quarantine_releases, reason=reason)

    def observe_step(self, out: SchedulerOutput) -> None:
        """One engine step ran `out`."""
        self.iteration_tokens.labels(**self._labels).observe(out.total_num_scheduled_tokens)

    def observe(self, scheduler: Scheduler) -> None:
        """Refresh gauges and the counters the engine keeps as running totals."""
        kv = scheduler.kv
        self.running.labels(**self._labels).set(len(scheduler.running))
        waiting = len(scheduler.waiting) + len(scheduler.remote) + len(scheduler.loading)
        self.waiting.labels(**self._labels).set(waiting)
        self.kv_usage.labels(**self._labels).set(kv.usage())
        self._add(self.prefix_queries, kv.stats.queries - self._seen_queries)
        self._add(self.prefix_hits, kv.stats.hits - self._seen_hits)
        self._add(self.preemptions, scheduler.num_preemptions - self._seen_preemptions)
        self._seen_queries, self._seen_hits = kv.stats.queries, kv.stats.hits
        self._seen_preemptions = scheduler.num_preemptions
        self.tiers.observe(kv)

    def child(self, metric, **labels: str):
        """`metric` bound to this node's labels plus `labels`."""
        return metric.labels(**self._labels, **labels)

    def _add(self, metric, amount: int) -> None:
        if amount:
            metric.labels(**self._labels).inc(amount)

    def _histogram(self, name: str, doc: str) -> Histogram:
        return Histogram(name, doc, LABELS, registry=self.registry, buckets=LATENCY_BUCKETS)

    def _gauge(self, name: str, doc: str) -> Gauge:
        return Gauge(name, doc, LABELS, registry=self.registry)

    def _counter(self, name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
        return Counter(name, doc, LABELS + extra, registry=self.registry)
