"""Figures of one simulated run: latency percentiles, goodput under an SLO, prefix-cache hit
rates (by KV tier), KV bytes moved between nodes and blocks between tiers, and per-pool
utilisation, as a JSON-ready dict."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tandem.engine.core.tier_ops import DISK, HOST, TIERS
from tandem.sim.cluster import Cluster, RequestRecord
from tandem.sim.node import SimNode

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class SLO:
    ttft_s: float = 2.0
    tpot_s: float = 0.1


def tpot(r: RequestRecord) -> float | None:
    """Time per output token after the first (None for one-token outputs)."""
    if r.num_output_tokens < 2 or r.finish_s is None or r.first_token_s is None:
        return None
    return (r.finish_s - r.first_token_s) / (r.num_output_tokens - 1)


def _percentiles(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {f"p{p}": None for p in (*PERCENTILES, "mean")}
    arr = np.asarray(values)
    out: dict[str, float | None] = {f"p{p}": float(np.percentile(arr, p)) for p in PERCENTILES}
    out["mean"] = float(arr.mean())
    return out


def summarize(cluster: Cluster, records: Sequence[RequestRecord], slo: SLO) -> dict[str, Any]:
    done = [r for r in records if r.outcome == "finished"]
    ttfts = [r.first_token_s - r.arrival_s for r in done]
    tpots = [t for r in done if (t := tpot(r)) is not None]
    e2es = [r.finish_s - r.arrival_s for r in done]
    start = min((r.arrival_s for r in records), default=0.0)
    end = max((r.finish_s for r in done), default=start)
    duration = max(end - start, 1e-9)
    good = sum(
        1
        for r in done
        if r.first_token_s - r.arrival_s <= slo.ttft_s and (tpot(r) or 0.0) <= slo.tpot_s
    )
    return {
        "num_requests": len(records),
        "num_finished": len(done),
        "duration_s": duration,
        "throughput_rps": len(done) / duration,
        "output_tokens_per_s": sum(r.num_output_tokens for r in done) / duration,
        "goodput_rps": good / duration,
        "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "attained": good / max(len(done), 1)},
        "ttft_s": _percentiles(ttfts),
        "tpot_s": _percentiles(tpots),
        "tpot_token_mean_s": _token_mean_tpot(done),
        "e2e_s": _percentiles(e2es),
        "phase_mean_s": _phase_means(records),
        "prefix_cache": _prefix_cache(cluster, records),
        "kv_tiers": _tiers(cluster),
        "kv_transfer": {
            "bytes": sum(p.num_bytes for p in cluster.all_prefills),
            "blocks": sum(p.num_blocks_sent for p in cluster.all_prefills),
            "remote_requests": sum(1 for r in records if r.remote),
        },
        "pools": {
            "decode": _pool(cluster.all_decodes, duration),
            "prefill": _pool(cluster.all_prefills, duration),
        },
        "failures": _failures(cluster, records),
        "num_preemptions": sum(n.scheduler.num_preemptions for n in cluster.nodes.values()),
        "num_events": cluster.events.num_events,
    }


def _phase_means(records: Sequence[RequestRecord]) -> dict[str, float]:
    """Mean seconds per phase over the requests that went through it (every outcome), as
    `tandem_request_phase_seconds`' sum over count."""
    seconds: dict[str, list[float]] = {}
    for r in records:
        for phase, s in r.phases.items():
            seconds.setdefault(phase, []).append(s)
    return {phase: float(np.mean(v)) for phase, v in seconds.items()}


def _token_mean_tpot(done: Sequence[RequestRecord]) -> float | None:
    """Mean time between two tokens over every later token (not per request): what a node's
    inter-token latency histogram averages."""
    gaps = sum(r.num_output_tokens - 1 for r in done if r.num_output_tokens > 1)
    span = sum(r.finish_s - r.first_token_s for r in done if r.num_output_tokens > 1)
    return span / gaps if gaps else None


def _failures(cluster: Cluster, records: Sequence[RequestRecord]) -> dict[str, Any]:
    """Outcomes other than finished (errors by the router's error class), the decode nodes'
    fall-backs by reason (as `tandem_prefill_fallbacks_total` counts them), the router's
    retries by reason (`tandem_router_retries_total`), how the requests a decode death hit
    ended, the prefill workers' failed KV writes (`tandem_kv_transfer_failures_total`), and
    what is still held at the end."""
    fallbacks: Counter[str] = Counter()
    for node in cluster.all_decodes:
        fallbacks.update(node.fallbacks)
    transfer_failures: Counter[str] = Counter()
    for node in cluster.all_prefills:
        transfer_failures.update(node.transfer_failures)
    outages = cluster.outages
    return {
        "aborted": sum(1 for r in records if r.outcome == "aborted"),
        "errors": sum(1 for r in records if r.outcome == "error"),
        "errors_by_kind": _count(r.error for r in records if r.outcome == "error"),
        "unfinished": sum(1 for r in records if r.outcome is None),
        "fallbacks": dict(sorted(fallbacks.items())),
        "recomputed_locally": sum(1 for r in records if r.fallbacks and r.remote is False),
        "prefill_deaths": outages.deaths["prefill"],
        "prefill_restarts": outages.restarts["prefill"],
        "decode_deaths": outages.deaths["decode"],
        "decode_restarts": outages.restarts["decode"],
        "router_retries": cluster.router.retries(),
        "decode_death_outcomes": _count(
            r.outcome for r in records if "decode_failed" in r.worker_failures
        ),
        "kv_transfer_failures": dict(sorted(transfer_failures.items())),
        "hold_timeouts": cluster.num_hold_timeouts,
        "held_blocks_at_end": cluster.num_held_blocks,
    }


def _count(values: Iterable[str | None]) -> dict[str, int]:
    return dict(sorted(Counter(str(v) for v in values).items()))


def _all_nodes(cluster: Cluster) -> list[SimNode]:
    return [*cluster.all_decodes, *cluster.all_prefills]


def _hit_rate(nodes: Sequence[SimNode]) -> float | None:
    queries = sum(n.kv.stats.queries for n in nodes)
    return sum(n.kv.stats.hits for n in nodes) / queries if queries else None


def _prefix_cache(cluster: Cluster, records: Sequence[RequestRecord]) -> dict[str, Any]:
    """Token hit rates as the nodes count them (`tandem_prefix_cache_*`), per role and over
    every node, the tokens found in each tier summed over the nodes
    (`tandem_kv_tier_hits_total`), and the share of prompt tokens that no node recomputed."""
    out: dict[str, Any] = {}
    for role, nodes in (("decode", cluster.all_decodes), ("prefill", cluster.all_prefills)):
        out[f"{role}_hit_rate"] = _hit_rate(nodes)
    out["hit_rate"] = _hit_rate(_all_nodes(cluster))
    found: Counter[str] = Counter()
    for node in _all_nodes(cluster):
        found.update(node.kv.stats.tier_hits)
    out["tier_hits"] = {tier: found[tier] for tier in TIERS}
    prompt = sum(r.num_prompt_tokens for r in records)
    reused = sum(max(r.num_cached_tokens, r.num_prefill_cached_tokens) for r in records)
    out["reused_token_share"] = reused / prompt if prompt else None
    return out


def _tiers(cluster: Cluster) -> dict[str, Any]:
    """Each node's lower tiers (blocks), and over every node the blocks moved down into and
    up from each tier by finished copies (`tandem_kv_tier_blocks_moved_total`), the copies
    and the seconds their links spent copying."""
    moved: Counter[tuple[str, str]] = Counter()
    links = []
    for node in _all_nodes(cluster):
        if node.kv.tiers is not None:
            moved.update(node.kv.tiers.moved)
            links.append(node.tier_link)
    config = cluster.config
    return {
        "host_blocks": config.kv_host_blocks,
        "disk_blocks": config.kv_disk_blocks,
        "moved": {tier: {d: moved[tier, d] for d in ("down", "up")} for tier in (HOST, DISK)},
        "copies": sum(link.num_copies for link in links),
        "copy_busy_s": sum(link.busy_s for link in links),
    }


def _pool(nodes: Sequence, duration: float) -> dict[str, Any]:
    """Per worker (its URL: a restarted node and the one it replaced count as one)."""
    if not nodes:
        return {"nodes": 0}
    busy_s: Counter[str] = Counter()
    kv_s: Counter[str] = Counter()
    waiting_s: Counter[str] = Counter()
    for n in nodes:
        busy_s[n.url] += n.busy_s
        kv_s[n.url] += n.kv_usage_s
        waiting_s[n.url] += n.waiting_s
    busy = [b / duration for b in busy_s.values()]
    kv = [k / duration for k in kv_s.values()]
    steps = sum(n.num_steps for n in nodes)
    return {
        "nodes": len(busy),
        "busy_mean": float(np.mean(busy)),
        "busy_max": float(np.max(busy)),
        "kv_usage_mean": float(np.mean(kv)),
        # per worker, as an HPA on `tandem_num_requests_waiting` averages it over the pods
        "waiting_mean": float(np.mean([w / duration for w in waiting_s.values()])),
        "steps": steps,
        "steps_of_one": sum(n.batch_sizes[1] for n in nodes),  # a step of a single request
        "batch_mean": sum(k * c for n in nodes for k, c in n.batch_sizes.items()) / max(steps, 1),
    }
