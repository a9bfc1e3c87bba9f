"""The simulated clock: time order, ties in scheduling order, no event in the past."""

from __future__ import annotations

import pytest

from tandem.sim.events import EventQueue


def test_events_run_in_time_order_and_ties_in_the_order_scheduled():
    q = EventQueue()
    seen = []
    q.at(2.0, seen.append, "c")
    q.at(1.0, seen.append, "a")
    q.at(1.0, seen.append, "b")
    q.at(1.0, lambda: q.after(0.5, seen.append, "d"))
    q.run()
    assert seen == ["a", "b", "d", "c"]
    assert q.now == 2.0


def test_run_until_stops_before_later_events_and_the_past_is_refused():
    q = EventQueue()
    seen = []
    q.at(1.0, seen.append, 1)
    q.at(3.0, seen.append, 3)
    q.run(until=2.0)
    assert seen == [1]
    with pytest.raises(ValueError, match="past"):
        q.at(0.5, seen.append, 0)
    q.run()
    assert seen == [1, 3]
