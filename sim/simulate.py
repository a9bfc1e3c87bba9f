"""One simulation from plain inputs, and a sweep of it over load factors."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from tandem.sim.cluster import Cluster, ClusterConfig, RequestRecord
from tandem.sim.faults import Faults
from tandem.sim.profiles import DeviceProfile
from tandem.sim.results import SLO, summarize
from tandem.sim.shapes import ModelShape
from tandem.sim.slo_watch import SLOWatch
from tandem.sim.workload import SimRequest, fit_lengths, scale_load


def simulate(
    config: ClusterConfig,
    shape: ModelShape,
    profile: DeviceProfile,
    requests: Sequence[SimRequest],
    slo: SLO,
    faults: Faults | None = None,
    seed: int = 0,
    attainment: float | None = None,
) -> dict[str, Any]:
    """Run the workload on a fresh cluster; the summary, with the wall time it took. With
    `attainment`, the run stops as soon as the SLOs cannot be met at that share
    (`stopped_early` in the summary; its figures are those of the requests seen so far)."""
    start = time.perf_counter()
    watch = None if attainment is None else SLOWatch(slo, attainment, len(requests))
    cluster, records = run_cluster(config, shape, profile, requests, faults, seed, watch)
    summary = summarize(cluster, records, slo)
    summary["stopped_early"] = cluster.events.stopped
    summary["num_events"] = cluster.events.num_events
    summary["wall_s"] = time.perf_counter() - start
    return summary


def run_cluster(
    config: ClusterConfig,
    shape: ModelShape,
    profile: DeviceProfile,
    requests: Sequence[SimRequest],
    faults: Faults | None = None,
    seed: int = 0,
    watch: SLOWatch | None = None,
) -> tuple[Cluster, list[RequestRecord]]:
    """Run the workload on a fresh cluster, its KV invariants checked at the end; the
    cluster and the requests' records, in arrival order. `seed`: the cluster's draws (the
    steps' spread, where the profile has one)."""
    cluster = Cluster(config, shape, profile, seed, faults, watch)
    records = cluster.run(fit_lengths(requests, config.max_model_len))
    cluster.check_integrity()
    return cluster, records


def sweep(
    config: ClusterConfig,
    shape: ModelShape,
    profile: DeviceProfile,
    requests: Sequence[SimRequest],
    slo: SLO,
    load_factors: Sequence[float],
    faults: Faults | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """The workload replayed at each load factor (arrival times divided by it)."""
    span = max(r.arrival_s for r in requests) - min(r.arrival_s for r in requests)
    runs = []
    for factor in load_factors:
        summary = simulate(config, shape, profile, scale_load(requests, factor), slo, faults, seed)
        offered = len(requests) / (span / factor) if span > 0 else float("inf")
        runs.append({"load_factor": factor, "offered_rps": offered, **summary})
    return {
        "model": asdict(shape),
        "profile": asdict(profile),
        "cluster": asdict(config),
        "faults": asdict(faults) if faults else None,
        "runs": runs,
    }
