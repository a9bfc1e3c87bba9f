"""One hour of `planner_day.py`: its sample window served by one layout (`serve_window`),
and what it came to (`HourRun`).

Each window starts on an empty deployment, which a live one never is: the requests that
arrive in its first `warmup_s` fill it and are served but not counted, so an undersized
layout is judged on its queues, not on its first quiet seconds. Its figures, and the pools'
time means the HPA reads (`PoolMeans`), cover the requests that arrive after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tandem.planner.layout_search import Layout
from tandem.sim.cluster import Cluster, ClusterConfig, RequestRecord
from tandem.sim.node import SimNode
from tandem.sim.profiles import DeviceProfile
from tandem.sim.results import SLO, summarize
from tandem.sim.shapes import ModelShape
from tandem.sim.workload import SimRequest, fit_lengths


@dataclass(frozen=True)
class PoolMeans:
    """Per worker, averaged over the pool's workers: requests waiting
    (`tandem_num_requests_waiting`) and KV cache usage, each step's value weighted by its
    time, over the counted span (the warm-up's end to the last request's end)."""

    waiting: float
    kv_usage: float


@dataclass
class HourRun:
    """One hour's window served by `layout`; the hour counts `devices` for its 3,600 s.
    `records`: the counted requests' (the planner's next decision reads them)."""

    hour: int
    rate_rps: float
    layout: Layout
    devices: int
    records: list[RequestRecord]
    summary: dict[str, Any]
    pools: dict[str, PoolMeans]

    @property
    def num_requests(self) -> int:
        return self.summary["num_requests"]

    @property
    def attainment(self) -> float:
        """Of the counted requests, the share finished within both targets."""
        good = self.summary["slo"]["attained"] * self.summary["num_finished"]
        return good / max(self.num_requests, 1)

    @property
    def goodput_rps(self) -> float:
        """Requests per second within the SLOs over the hour: its rate times attainment."""
        return self.rate_rps * self.attainment


@dataclass(frozen=True)
class WindowRun:
    records: list[RequestRecord]
    summary: dict[str, Any]
    pools: dict[str, PoolMeans]


def serve_window(
    config: ClusterConfig,
    shape: ModelShape,
    profile: DeviceProfile,
    requests: Sequence[SimRequest],
    slo: SLO,
    warmup_s: float,
) -> WindowRun:
    """The window on a fresh cluster, its KV invariants checked at the end; figures of the
    requests that arrived at or after `warmup_s`."""
    cluster = Cluster(config, shape, profile)
    marks: dict[str, tuple[float, float]] = {}
    cluster.events.at(warmup_s, lambda: marks.update(_integrals(cluster)))
    records = cluster.run(fit_lengths(requests, config.max_model_len))
    cluster.check_integrity()
    counted = [r for r in records if r.arrival_s >= warmup_s]
    end = max((r.finish_s or 0.0 for r in records), default=warmup_s)
    span = max(end - warmup_s, 1e-9)
    now = _integrals(cluster)
    pools = {
        role: _means([now[n.url] for n in nodes], [marks[n.url] for n in nodes], span)
        for role, nodes in (("prefill", cluster.all_prefills), ("decode", cluster.all_decodes))
    }
    return WindowRun(counted, summarize(cluster, counted, slo), pools)


def _integrals(cluster: Cluster) -> dict[str, tuple[float, float]]:
    nodes: list[SimNode] = [*cluster.all_prefills, *cluster.all_decodes]
    return {n.url: (n.waiting_s, n.kv_usage_s) for n in nodes}


def _means(
    now: Sequence[tuple[float, float]], then: Sequence[tuple[float, float]], span: float
) -> PoolMeans:
    if not now:
        return PoolMeans(0.0, 0.0)
    waiting = sum(a[0] - b[0] for a, b in zip(now, then)) / len(now) / span
    kv = sum(a[1] - b[1] for a, b in zip(now, then)) / len(now) / span
    return PoolMeans(waiting, kv)
