"""How `planner_day.py` sizes the pools each hour: three policies behind one interface
(`layout_for`), each given what the previous hour came to (`HourRun`).

- `Static`: one layout all day.
- `Planned`: the SLO planner (`Planner.decide`) on the previous hour's window as the
  routers would have measured it; the stabilizer steps by the hour.
- `Hpa`: the HorizontalPodAutoscaler the operator renders for each pool without `spec.slo`
  (operator/scaling.py): prefill on requests waiting per pod (target 4), decode on KV cache
  usage per pod (target 0.8), each `ceil(current * observed / target)` within its bounds,
  held within the HPA's 10% tolerance; observed: the previous hour's time means per pod
  (`PoolMeans`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

from day_hour import HourRun
from diurnal import traffic_of

from tandem.planner.layout_search import Bounds, Layout
from tandem.planner.planner import Decision, Planner

HPA_TOLERANCE = 0.1  # the controller's default: no change within 10% of the target
PREFILL_WAITING_TARGET = 4.0  # operator/scaling.py DEFAULT_TARGETS
DECODE_KV_TARGET = 0.8


class Policy(Protocol):
    name: str
    start: Layout | None  # the layout of the hour before the first (None: no warm-up)

    def layout_for(self, hour: int, previous: HourRun | None) -> Layout:
        """The layout that serves `hour`, given the previous hour's run (None only for a
        policy without a warm-up, at the first hour)."""
        ...


@dataclass
class Static:
    name: str
    layout: Layout
    start: Layout | None = None

    def layout_for(self, hour: int, previous: HourRun | None) -> Layout:
        return self.layout


@dataclass
class Planned:
    """The planner deciding once an hour, at the hour's start (`now_s` = hour x 3,600 s)."""

    planner: Planner
    start: Layout
    window_s: float
    block_size: int
    name: str = "planner"
    decisions: dict[int, Decision] = field(default_factory=dict)  # by hour

    def layout_for(self, hour: int, previous: HourRun | None) -> Layout:
        assert previous is not None, "the planner decides on the previous hour's traffic"
        traffic = traffic_of(previous.records, self.window_s, self.block_size)
        decision = self.planner.decide(hour * 3600.0, previous.layout, traffic)
        self.decisions[hour % 24] = decision
        return decision.target


@dataclass
class Hpa:
    prefill: Bounds
    decode: Bounds
    start: Layout
    name: str = "HPA"

    def layout_for(self, hour: int, previous: HourRun | None) -> Layout:
        assert previous is not None, "the HPA scales on the previous hour's metrics"
        prefill, decode = previous.pools["prefill"], previous.pools["decode"]
        current = previous.layout
        return Layout(
            hpa_replicas(current.prefill, prefill.waiting, PREFILL_WAITING_TARGET, self.prefill),
            hpa_replicas(current.decode, decode.kv_usage, DECODE_KV_TARGET, self.decode),
        )


def hpa_replicas(current: int, observed: float, target: float, bounds: Bounds) -> int:
    """The HPA's answer for a per-pod average metric: `ceil(current * observed / target)`,
    `current` while the ratio is within the tolerance, always within the bounds."""
    ratio = observed / target
    wanted = current if abs(ratio - 1.0) <= HPA_TOLERANCE else math.ceil(current * ratio)
    return min(bounds.max_replicas, max(bounds.min_replicas, wanted))
