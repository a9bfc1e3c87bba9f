"""The router's health checks (against a mock transport) and ejections: a check may take
`--health-timeout` whatever the interval (a busy node on a busy machine answers late and is
not dead), a worker seen back with a new agent name counts as a restart, and with every
decode worker ejected the router still tries those that served before rather than refuse."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
from prometheus_client import CollectorRegistry, generate_latest

from tandem.router.discovery import StaticDiscovery
from tandem.router.kv_index import PrefixIndex
from tandem.router.metrics import RouterMetrics
from tandem.router.monitor import WorkerMonitor
from tandem.router.workers import WorkerAddress, WorkerPool
from tests.disagg.nodes import metric_value

URL = "http://d:1"


def monitor_rounds(
    health: Callable[[httpx.Request], httpx.Response], rounds: int, **options: float
) -> tuple[WorkerPool, RouterMetrics]:
    """`rounds` monitoring rounds over one decode worker whose /health is `health`."""
    pool = WorkerPool()
    metrics = RouterMetrics(CollectorRegistry(), "m", "router-0")

    async def go() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(health)) as http:
            discovery = StaticDiscovery([], [URL])
            monitor = WorkerMonitor(
                pool, PrefixIndex(), discovery, http, metrics=metrics, **options
            )
            for _ in range(rounds):
                await monitor.check_once()
            monitor.close()

    asyncio.run(go())
    return pool, metrics


def test_a_health_check_may_take_the_health_timeout_whatever_the_interval():
    timeouts = []

    def health(request: httpx.Request) -> httpx.Response:
        timeouts.append(request.extensions["timeout"]["read"])
        return httpx.Response(200, json={"role": "decode", "agent": "decode-a-1"})

    pool, _ = monitor_rounds(health, 2, interval_s=0.1, timeout_s=7.0)
    assert timeouts == [7.0, 7.0]
    assert pool.workers[URL].healthy


def test_a_worker_back_with_a_new_agent_counts_a_restart():
    agents = iter(["decode-a-1", "decode-a-1", "decode-a-2"])

    def health(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"role": "decode", "agent": next(agents)})

    _, metrics = monitor_rounds(health, 3)
    text = generate_latest(metrics.registry).decode()
    assert metric_value(text, "tandem_router_worker_restarts_total", worker=URL) == 1
    assert metric_value(text, "tandem_router_worker_restarts_total", worker_role="decode") == 1


def test_with_every_decode_worker_ejected_those_that_served_before_are_tried():
    pool = WorkerPool()
    urls = ["http://d:1", "http://d:2", "http://d:3"]
    pool.update(
        [WorkerAddress(u, "decode") for u in urls] + [WorkerAddress("http://p:1", "prefill")]
    )
    for url in [*urls[:2], "http://p:1"]:
        pool.health_ok(url, {"role": pool.workers[url].address.role, "agent": f"a-{url}"})
    # d:3 never answered; d:2 is ejected (a request to it broke): only d:1 is routed to
    pool.health_failed("http://d:2", eject=True)
    assert [v.url for v in pool.snapshot({})[1]] == ["http://d:1"]
    # d:1 ejected too (a slow health check): rather than refuse, try those that served
    pool.health_failed("http://d:1", eject=True)
    prefill, decode = pool.snapshot({})
    assert [v.url for v in decode] == ["http://d:1", "http://d:2"]
    assert [v.url for v in prefill] == ["http://p:1"]
    # once tried (excluded), they are not offered again; a worker that never answered never
    assert pool.snapshot({}, frozenset(urls[:2]))[1] == ()


def test_worker_health_series_follow_the_pool_and_a_router_without_decode_reads_zero():
    """A worker dropped from the pool leaves its series with it (a stale 1 would hide the
    no-healthy-decode alert), and a router that knows no decode worker still has the
    in-flight gauge that the alert reads as zero."""
    pool, metrics = WorkerPool(), RouterMetrics(CollectorRegistry(), "m", "router-0")
    old, new = "http://d-old:1", "http://d-new:1"
    pool.update([WorkerAddress(old, "decode")])
    pool.health_ok(old, {"role": "decode", "agent": "a"})
    metrics.observe_workers(pool.workers.values())
    text = generate_latest(metrics.registry).decode()
    assert metric_value(text, "tandem_router_worker_healthy", worker=old) == 1

    pool.update([WorkerAddress(new, "decode")])  # replaced: old stays until new is healthy
    pool.health_ok(new, {"role": "decode", "agent": "b"})
    pool.update([WorkerAddress(new, "decode")])  # now old goes
    metrics.observe_workers(pool.workers.values())
    text = generate_latest(metrics.registry).decode()
    assert f'worker="{old}"' not in text
    assert metric_value(text, "tandem_router_worker_healthy", worker=new) == 1

    pool.health_failed(new, eject=True)
    pool.update([])
    metrics.observe_workers(pool.workers.values())
    text = generate_latest(metrics.registry).decode()
    assert "tandem_router_worker_healthy{" not in text
    assert 'tandem_router_requests_in_flight{model="m"' in text
