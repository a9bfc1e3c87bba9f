"""kv-aware routing over KV tiers: a device hit costs nothing, a host or disk hit a fraction
of a computed block (`TierCosts`), a miss a whole one."""

from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry

from tandem.router.kv_index import PrefixMatch
from tandem.router.metrics import RouterMetrics
from tandem.router.policy import (
    RouteRequest,
    Snapshot,
    TierCosts,
    decode_cost,
    kv_aware,
    prefill_cost,
)
from tandem.router.workers import WorkerAddress, WorkerPool, WorkerView


def view(url: str, role: str, device: int = 0, host: int = 0, disk: int = 0) -> WorkerView:
    endpoint = f"tcp://{url}" if role == "prefill" else None
    return WorkerView(
        url, role, "r1", endpoint, total_blocks=100, free_blocks=100,
        overlap_blocks=device + host + disk, host_blocks=host, disk_blocks=disk,
    )  # fmt: skip


D = (view("d0", "decode"),)
P = (view("p0", "prefill"),)
REQ = RouteRequest(seq=0, num_blocks=8, num_tokens=130)


def prefill_pick(workers: tuple[WorkerView, ...], req: RouteRequest = REQ) -> set[str]:
    """The prefill worker chosen, whatever the tie-breaking rotation (every seq of it)."""
    return {kv_aware(Snapshot(workers, D), replace(req, seq=s)).prefill.url for s in range(4)}


def decode_pick(workers: tuple[WorkerView, ...], req: RouteRequest = REQ) -> set[str]:
    return {kv_aware(Snapshot(P, workers), replace(req, seq=s)).decode.url for s in range(4)}


@pytest.mark.parametrize("order", [1, -1])
def test_a_device_hit_beats_an_equal_host_hit_which_beats_an_equal_disk_hit(order):
    device = view("a", "prefill", device=4)
    host, disk = view("b", "prefill", host=4), view("c", "prefill", disk=4)
    assert prefill_pick((device, host, disk)[::order]) == {"a"}
    assert prefill_pick((host, disk)[::order]) == {"b"}


def test_a_host_hit_beats_a_miss():
    assert prefill_pick((view("a", "prefill"), view("b", "prefill", host=1))) == {"b"}
    assert prefill_pick((view("a", "prefill"), view("b", "prefill", disk=1))) == {"b"}


def test_a_long_host_run_beats_a_short_device_run_unless_host_hits_cost_as_much():
    short, long = view("a", "prefill", device=2), view("b", "prefill", host=8)
    assert prefill_pick((short, long)) == {"b"}  # 6 blocks to compute against 8 x 0.1
    dear = replace(REQ, tier_costs=TierCosts(host_hit_cost=1.0))
    assert prefill_pick((short, long), dear) == {"a"}  # 6 against 8


def test_a_run_across_tiers_costs_each_block_by_its_tier():
    costs = TierCosts(host_hit_cost=0.25, disk_hit_cost=0.5)
    req = replace(REQ, tier_costs=costs)
    worker = view("a", "prefill", device=2, host=2, disk=2)  # and 2 blocks to compute
    assert prefill_cost(worker, req) == 2 * 0 + 2 * 0.25 + 2 * 0.5 + 2 * 1
    assert decode_cost(worker, req) == prefill_cost(worker, req)  # idle, nothing held


def test_a_decode_worker_holding_the_prefix_in_host_memory_is_preferred():
    assert decode_pick((view("d0", "decode"), view("d1", "decode", host=8))) == {"d1"}
    assert decode_pick((view("d0", "decode", device=8), view("d1", "decode", host=8))) == {"d0"}


@pytest.mark.parametrize(
    "costs", [{"host_hit_cost": -0.1}, {"disk_hit_cost": 1.5}, {"host_hit_cost": float("nan")}]
)
def test_tier_costs_outside_zero_to_one_are_refused(costs):
    with pytest.raises(ValueError, match="must be within"):
        TierCosts(**costs)


def test_the_pool_puts_each_tier_in_the_view():
    pool = WorkerPool()
    pool.update([WorkerAddress("http://d", "decode")])
    pool.health_ok("http://d", {"role": "decode", "agent": "agent-a"})
    (worker,) = pool.snapshot({"http://d": PrefixMatch(2, 3, 1)})[1]
    assert (worker.overlap_blocks, worker.device_blocks) == (6, 2)
    assert (worker.host_blocks, worker.disk_blocks) == (3, 1)


def test_the_prefix_metric_counts_the_chosen_prefill_workers_hits_by_tier():
    registry = CollectorRegistry()
    metrics = RouterMetrics(registry, "m", "pod")
    route = kv_aware(Snapshot((view("p0", "prefill", 2, 3, 1),), D), REQ)
    metrics.observe_route(route, 0.001)
    metrics.observe_route(route, 0.001)
    name = "tandem_router_prefix_overlap_blocks_total"
    labels = {"model": "m", "role": "router", "pod": "pod"}
    found = {
        tier: registry.get_sample_value(name, {**labels, "tier": tier})
        for tier in ("device", "host", "disk")
    }
    assert found == {"device": 4, "host": 6, "disk": 2}
