"""The routers' traffic over an interval, read from the Prometheus text of the router's own
metrics (`RouterMetrics` on a registry of its own per router)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tandem.planner.traffic import PROMPT, TPOT, TTFT, RouterScrape, window
from tandem.router.metrics import RouterMetrics
from tandem.router.phase_metrics import ChoiceClock


class Router:
    def __init__(self, pod: str) -> None:
        self.metrics = RouterMetrics(CollectorRegistry(), "m", pod)

    def finish(self, prompt: int, generated: int, ttft: float, tpot: float) -> None:
        clock = ChoiceClock(start=0.0)
        for i in range(generated):
            last = i == generated - 1
            record = {"token_ids": [1], "finish_reason": "stop" if last else None,
                      "received_at": ttft + i * tpot}  # fmt: skip
            if last:
                record["usage"] = {"prompt_tokens": prompt, "completion_tokens": generated}
            clock.on_record(record)
        self.metrics.phases.observe(clock)
        self.metrics.child(self.metrics.ttft).observe(ttft)

    def scrape(self) -> RouterScrape:
        return RouterScrape.parse(generate_latest(self.metrics.registry).decode())


def test_a_window_counts_what_ended_and_what_is_still_running():
    a, b = Router("a"), Router("b")
    a.finish(100, 10, 0.2, 0.02)
    before = {"a": a.scrape(), "b": b.scrape()}
    for _ in range(3):
        a.finish(300, 20, 0.4, 0.03)
    b.finish(1000, 5, 3.0, 0.2)
    a.metrics.child(a.metrics.in_flight).set(2)  # two more arrived, not finished yet
    a.metrics.child(a.metrics.prefix_blocks, tier="device").inc(25)  # 400 tokens of 16
    t = window(before, {"a": a.scrape(), "b": b.scrape()}, seconds=10.0, block_size=16)
    assert t.arrivals == 3 + 1 + 2 and t.rate_rps == pytest.approx(0.6)
    assert t.finished == 4
    assert t.histograms[PROMPT].total == 3 * 300 + 1000
    assert t.prefix_hit_rate == pytest.approx(400 / 1900)
    assert t.histograms[TPOT].count == 4
    assert t.histograms[TTFT].quantile(0.5) < 1.0
    # 3 of 4 within TTFT 1 s and TPOT 50 ms; the one that missed missed both
    assert t.attainment(1.0, 0.05) == pytest.approx(0.75)
    assert t.attainment(0.1, 0.05) == pytest.approx(0.0)


def test_a_restarted_router_counts_from_zero_and_a_new_one_counts_whole():
    old = Router("a")
    for _ in range(5):
        old.finish(100, 4, 0.1, 0.01)
    before = {"a": old.scrape()}
    restarted, new = Router("a"), Router("c")
    restarted.finish(100, 4, 0.1, 0.01)
    new.finish(50, 4, 0.1, 0.01)
    new.finish(50, 4, 0.1, 0.01)
    t = window(before, {"a": restarted.scrape(), "c": new.scrape()}, 5.0, 16)
    assert t.arrivals == 3 and t.finished == 3
    assert t.histograms[PROMPT].total == 200


def test_a_router_that_served_nothing_yet_adds_nothing():
    busy, idle = Router("a"), Router("b")  # b's histograms have no series at all
    before = {"a": busy.scrape(), "b": idle.scrape()}
    busy.finish(100, 4, 0.1, 0.01)
    t = window(before, {"a": busy.scrape(), "b": idle.scrape()}, 1.0, 16)
    assert t.finished == 1 and t.histograms[PROMPT].total == 100


def test_an_idle_window_has_no_rate_and_no_attainment():
    r = Router("a")
    t = window({"a": r.scrape()}, {"a": r.scrape()}, 30.0, 16)
    assert t.rate_rps == 0.0 and t.finished == 0
    assert t.attainment(1.0, 0.1) is None and t.prefix_hit_rate == 0.0
    assert window({}, {}, 30.0, 16).finished == 0


def test_text_that_is_not_metrics_is_a_value_error():
    with pytest.raises(ValueError):
        RouterScrape.parse("this is { not metrics")
