"""A node's `/health` and `/health/live` on its real apps and engine thread, with a stand-in
worker instead of a model and a clock the test moves: loading is not a stall, an engine
thread stuck in a step is one (503 with the reason), and a thread that turns again is
healthy again. The probes ask the metrics app; the router's `/health` on the control app
says the same."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from tandem.engine.api.wire import PROTOCOL_VERSION, Fingerprint
from tandem.node.heartbeat import Heartbeat
from tandem.node.loop import NodeLoop
from tandem.node.server import NodeServer
from tests.bounds import HANG_S
from tests.disagg.nodes import wait_until


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class StandIn:
    """A worker whose `run_once` blocks while `gate` is closed (a step that hangs), and
    otherwise waits for the loop to stop (an idle poll)."""

    def __init__(self, loop: NodeLoop) -> None:
        self.loop = loop
        self.gate = threading.Event()
        self.gate.set()
        self.stuck = threading.Event()  # set while run_once is blocked on the gate
        identity = SimpleNamespace(role="decode", model="m", revision="r")
        config = SimpleNamespace(cache=SimpleNamespace(block_size=16))
        fingerprint = Fingerprint(PROTOCOL_VERSION, "m", "r", "float32", 16, "1x2x1x8")
        self.core = SimpleNamespace(identity=identity, agent=SimpleNamespace(name="a"),
                                    config=config, fingerprint=fingerprint)  # fmt: skip

    def run_once(self) -> None:
        if not self.gate.is_set():
            self.stuck.set()
            self.gate.wait(HANG_S)
            self.stuck.clear()
        self.loop.stopping.wait(0.01)

    def ports(self) -> dict[str, int]:
        return {"events_port": 1}

    def close(self) -> None:
        pass


@pytest.fixture
def node():
    clock, loaded = Clock(), threading.Event()
    workers: list[StandIn] = []

    def build(loop: NodeLoop) -> StandIn:
        loaded.wait(HANG_S)
        workers.append(StandIn(loop))
        return workers[0]

    server = NodeServer(build, CollectorRegistry(), Heartbeat(30.0, clock))
    with TestClient(server.app) as control, TestClient(server.metrics_app) as client:
        yield SimpleNamespace(client=client, control=control, clock=clock, loaded=loaded,
                              workers=workers)  # fmt: skip
        loaded.set()
        if workers:
            workers[0].gate.set()


def test_a_loading_node_is_alive_but_not_ready_however_long_it_loads(node):
    node.clock.now += 3600
    live = node.client.get("/health/live")
    assert live.status_code == 200 and live.json()["status"] == "loading"
    health = node.client.get("/health")
    assert health.status_code == 503 and health.json()["status"] == "loading"
    node.loaded.set()
    assert wait_until(lambda: node.client.get("/health").status_code == 200)
    assert node.client.get("/health").json()["role"] == "decode"
    assert node.control.get("/health").json() == node.client.get("/health").json()


def test_an_engine_thread_stuck_in_a_step_is_503_with_the_reason_until_it_turns_again(node):
    node.loaded.set()
    assert wait_until(lambda: node.client.get("/health").status_code == 200)
    worker = node.workers[0]
    worker.gate.clear()
    assert worker.stuck.wait(HANG_S)
    node.clock.now += 30.0  # at the bound: still a long step
    assert node.client.get("/health").status_code == 200
    node.clock.now += 0.5
    for path in ("/health", "/health/live"):
        r = node.client.get(path)
        assert r.status_code == 503, (path, r.text)
        assert r.json()["status"] == "engine stalled" and r.json()["stalled_s"] == 30.5
    assert node.client.get("/health").json()["agent"] == "a"  # the fields routers read
    control = node.control.get("/health")
    assert control.status_code == 503 and control.json()["agent"] == "a"
    worker.gate.set()
    assert wait_until(lambda: node.client.get("/health").status_code == 200)
    live = node.client.get("/health/live")
    assert live.status_code == 200 and live.json()["status"] == "ok"


def test_the_stall_bound_must_be_positive():
    with pytest.raises(ValueError):
        Heartbeat(0)
