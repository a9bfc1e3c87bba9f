"""Up at once, down only to the highest plan of the window and not within the cooldown."""

from __future__ import annotations

from tandem.planner.layout_search import Layout
from tandem.planner.stabilizer import Stabilizer


def test_up_at_once_down_after_the_window_to_its_highest_plan():
    s = Stabilizer(down_window_s=300.0, cooldown_s=60.0)
    now = Layout(1, 1)
    now = s.settle(0.0, now, Layout(2, 4))
    assert now == Layout(2, 4)  # up at once, both pools
    now = s.settle(100.0, now, Layout(1, 2))
    assert now == Layout(2, 4)  # the window still holds the plan of t=0
    now = s.settle(200.0, now, Layout(1, 3))
    assert now == Layout(2, 4)
    now = s.settle(301.0, now, Layout(1, 1))
    assert now == Layout(1, 3)  # the highest plan since t=1: t=200's
    now = s.settle(320.0, now, Layout(1, 1))
    assert now == Layout(1, 3)  # cooldown: changed at 301
    now = s.settle(501.0, now, Layout(1, 1))
    assert now == Layout(1, 1)


def test_a_fresh_stabilizer_keeps_the_current_layout_for_a_window():
    s = Stabilizer(down_window_s=300.0, cooldown_s=0.0)
    assert s.settle(0.0, Layout(2, 3), Layout(1, 1)) == Layout(2, 3)
    assert s.settle(299.0, Layout(2, 3), Layout(1, 1)) == Layout(2, 3)
    assert s.settle(301.0, Layout(2, 3), Layout(1, 1)) == Layout(1, 1)


def test_a_pool_scales_up_within_the_other_pools_cooldown():
    s = Stabilizer(down_window_s=0.0, cooldown_s=60.0)
    now = s.settle(0.0, Layout(2, 2), Layout(1, 2))
    assert now == Layout(1, 2)
    now = s.settle(10.0, now, Layout(3, 3))
    assert now == Layout(3, 3)  # scaling up waits for no cooldown
    assert s.settle(20.0, now, Layout(1, 1)) == Layout(3, 3)


def test_another_threshold_only_once_planned_for_a_whole_window_and_not_in_the_cooldown():
    s = Stabilizer(down_window_s=100.0, cooldown_s=150.0)
    now = Layout(1, 2, threshold=0)
    now = s.settle(0.0, now, Layout(1, 3, threshold=512))
    assert now == Layout(1, 3, threshold=0)  # the pools at once, the threshold held
    now = s.settle(60.0, now, Layout(1, 3, threshold=2048))
    assert now.threshold == 0  # another choice: its own window starts
    now = s.settle(120.0, now, Layout(1, 3, threshold=0))
    now = s.settle(130.0, now, Layout(1, 3, threshold=2048))
    now = s.settle(229.0, now, Layout(1, 3, threshold=2048))
    assert now.threshold == 0  # a break at 120: 99 s of 100
    now = s.settle(230.0, now, Layout(1, 3, threshold=2048))
    assert now == Layout(1, 3, threshold=2048)
    now = s.settle(240.0, now, Layout(1, 3, threshold=0))
    now = s.settle(379.0, now, Layout(1, 3, threshold=0))
    assert now.threshold == 2048  # held for the window, but within the cooldown of 230
    assert s.settle(380.0, now, Layout(1, 3, threshold=0)).threshold == 0


def test_a_threshold_change_waits_for_no_pool_and_no_pool_for_it():
    s = Stabilizer(down_window_s=0.0, cooldown_s=60.0)
    now = s.settle(0.0, Layout(2, 2, 0), Layout(1, 2, 512))
    assert now == Layout(1, 2, 512)  # no window: both at once
    assert s.settle(10.0, now, Layout(3, 2, 0)) == Layout(3, 2, 512)  # up; threshold cools
