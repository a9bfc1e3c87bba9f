"""Worker discovery: the static list, and EndpointSlices as the API server returns them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from tandem.router.discovery import StaticDiscovery, workers_from_endpoint_slices
from tandem.router.workers import WorkerAddress, WorkerPool

SLICES = json.loads((Path(__file__).parent / "fixtures" / "endpointslices.json").read_text())


def test_endpoint_slices_give_ready_workers_by_role():
    found = workers_from_endpoint_slices(SLICES["items"])
    assert found == [
        WorkerAddress("http://10.244.1.30:8081", "decode"),
        WorkerAddress("http://10.244.3.5:8081", "decode"),  # no conditions: ready
        WorkerAddress("http://[fd00::1e]:8081", "decode"),
        WorkerAddress("http://10.244.1.17:8080", "prefill"),
    ]  # not ready, terminating, router and port-less slices left out


def test_a_second_listing_with_the_same_pods_is_identical_and_dedupes():
    items = SLICES["items"] + SLICES["items"][:1]
    assert workers_from_endpoint_slices(items) == workers_from_endpoint_slices(SLICES["items"])


def test_static_discovery_and_pool_updates():
    discovery = StaticDiscovery(["http://p:1/"], ["http://d:2"])
    addresses = asyncio.run(discovery.addresses())
    pool = WorkerPool()
    assert pool.update(addresses) == (["http://p:1", "http://d:2"], [])
    assert not any(w.healthy for w in pool.workers.values())  # until a health check passes
    added, removed = pool.update([WorkerAddress("http://d:2", "decode")])
    assert (added, removed) == ([], ["http://p:1"])
    # the same URL with another role is a different worker
    assert pool.update([WorkerAddress("http://d:2", "prefill")]) == (
        ["http://d:2"],
        ["http://d:2"],
    )


def test_a_departing_worker_stays_until_another_of_its_role_is_healthy():
    """A rollout's discovery round drops the old decode pod (draining) and adds the new one
    (unchecked) at once: the old one serves until the new one is healthy, or until its own
    health checks fail."""
    pool = WorkerPool()
    info = {"role": "decode", "agent": "decode-a", "revision": "r1"}
    pool.update([WorkerAddress("http://old:1", "decode")])
    pool.health_ok("http://old:1", info)
    assert pool.update([WorkerAddress("http://new:1", "decode")]) == (["http://new:1"], [])
    assert [v.url for v in pool.snapshot({})[1]] == ["http://old:1"]
    pool.health_ok("http://new:1", {**info, "agent": "decode-b"})
    assert pool.update([WorkerAddress("http://new:1", "decode")]) == ([], ["http://old:1"])
    # a departing worker that fails its checks goes too, replacement or not
    pool.health_failed("http://new:1", eject=True)
    assert pool.update([]) == ([], ["http://new:1"])


def test_health_ejects_after_failures_and_brings_back():
    pool = WorkerPool()
    pool.update([WorkerAddress("http://d:2", "decode")])
    info = {"role": "decode", "agent": "decode-a", "revision": "r1", "events_port": 7}
    assert pool.health_ok("http://d:2", info) is False
    worker = pool.workers["http://d:2"]
    assert worker.healthy and worker.events_endpoint == "tcp://d:7"
    pool.health_failed("http://d:2")
    assert worker.healthy  # one failure is tolerated
    pool.health_failed("http://d:2")
    assert not worker.healthy
    assert pool.health_ok("http://d:2", {**info, "agent": "decode-b"}) is True  # restarted
    assert worker.healthy
    pool.health_ok("http://d:2", {**info, "role": "prefill"})  # a wrong role: ejected
    assert not worker.healthy
