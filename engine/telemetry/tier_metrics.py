"""The KV tiers' Prometheus metrics (`TierMetrics`): hits by tier, blocks and bytes moved
down and up, how long a request's load took, and each lower tier's occupancy. Every node
exports them (at 0, capacity 0, without tiers) (docs/kv-tiers.md)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tandem.engine.core.kv_cache_manager import KVCacheManager
from tandem.engine.core.tier_ops import DISK, HOST, TIERS

LABELS = ("model", "role", "pod")
LOAD_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
DIRECTIONS = ("down", "up")
LOWER_TIERS = (HOST, DISK)


class TierMetrics:
    """Bound to one node's labels; `observe` turns the tiers' running totals into counters."""

    def __init__(self, registry: CollectorRegistry, labels: dict[str, str]) -> None:
        self._labels = labels
        self.hits = Counter(
            "tandem_kv_tier_hits_total", "Prompt tokens found cached, by KV tier.",
            (*LABELS, "tier"), registry=registry,
        )  # fmt: skip
        self.blocks_moved = Counter(
            "tandem_kv_tier_blocks_moved_total",
            "KV blocks copied down into (stored) or up from (loaded) a lower tier.",
            (*LABELS, "tier", "direction"), registry=registry,
        )  # fmt: skip
        self.bytes_moved = Counter(
            "tandem_kv_tier_bytes_moved_total", "KV bytes copied down into or up from a tier.",
            (*LABELS, "tier", "direction"), registry=registry,
        )  # fmt: skip
        self.load_seconds = Histogram(
            "tandem_kv_tier_load_seconds",
            "A request's load from lower tiers, queued to landed (it runs beside steps).",
            LABELS, registry=registry, buckets=LOAD_BUCKETS,
        )  # fmt: skip
        self.used = Gauge(
            "tandem_kv_tier_used_blocks", "Blocks held by a KV tier.", (*LABELS, "tier"),
            registry=registry,
        )  # fmt: skip
        self.capacity = Gauge(
            "tandem_kv_tier_capacity_blocks", "Blocks a KV tier can hold.", (*LABELS, "tier"),
            registry=registry,
        )  # fmt: skip
        self.failed = Counter(
            "tandem_kv_tier_copy_failures_total", "Tier copies that failed (what they carried "
            "is forgotten).", LABELS, registry=registry,
        )  # fmt: skip
        self._seen_hits: dict[str, int] = {}
        self._seen_moved: dict[tuple[str, str], int] = {}
        self._seen_failed = 0
        self._start_at_zero()

    def _start_at_zero(self) -> None:
        """Every series present from the start, so a dashboard reads 0, not "No data"; a
        capacity of 0 is a tier the node does not have."""
        for tier in TIERS:
            self.hits.labels(**self._labels, tier=tier)
        for tier in LOWER_TIERS:
            for direction in DIRECTIONS:
                self.blocks_moved.labels(**self._labels, tier=tier, direction=direction)
                self.bytes_moved.labels(**self._labels, tier=tier, direction=direction)
            self.used.labels(**self._labels, tier=tier).set(0)
            self.capacity.labels(**self._labels, tier=tier).set(0)
        self.load_seconds.labels(**self._labels)
        self.failed.labels(**self._labels)

    def observe(self, kv: KVCacheManager) -> None:
        tiers = kv.tiers
        if tiers is None:
            return
        for tier in TIERS:
            self._advance(self.hits.labels(**self._labels, tier=tier), self._seen_hits, tier,
                          kv.stats.tier_hits[tier])  # fmt: skip
        for (tier, direction), blocks in tiers.moved.items():
            seen = self._seen_moved.get((tier, direction), 0)
            if blocks > seen:
                labels = {**self._labels, "tier": tier, "direction": direction}
                self.blocks_moved.labels(**labels).inc(blocks - seen)
                self.bytes_moved.labels(**labels).inc((blocks - seen) * tiers.block_bytes)
                self._seen_moved[(tier, direction)] = blocks
        for s in tiers.drain_load_seconds():
            self.load_seconds.labels(**self._labels).observe(s)
        for name, counts in tiers.counts().items():
            self.used.labels(**self._labels, tier=name).set(counts.used)
            self.capacity.labels(**self._labels, tier=name).set(counts.total)
        if tiers.failed_copies > self._seen_failed:
            self.failed.labels(**self._labels).inc(tiers.failed_copies - self._seen_failed)
            self._seen_failed = tiers.failed_copies

    def _advance(self, child, seen: dict[str, int], key: str, total: int) -> None:
        if total > seen.get(key, 0):
            child.inc(total - seen.get(key, 0))
            seen[key] = total
