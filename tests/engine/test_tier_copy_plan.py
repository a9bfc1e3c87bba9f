"""The order of the copies one store call queues (`CopyPlan`)."""

from __future__ import annotations

from tandem.engine.core.tier_copy_plan import CopyPlan
from tandem.engine.core.tier_ops import DEVICE, DISK, HOST


def test_blocks_between_the_same_tiers_join_one_copy():
    plan = CopyPlan()
    for i in range(1000):
        plan.add(DEVICE, HOST, i, 1000 + i, i)
    assert len(plan.ops) == 1
    assert plan.ops[0].src_slots == list(range(1000))
    assert plan.ops[0].dst_slots == list(range(1000, 2000))


def test_a_new_pair_of_tiers_or_a_slot_written_twice_starts_a_new_copy():
    plan = CopyPlan()
    plan.add(DEVICE, HOST, 0, 5, 10)
    plan.add(HOST, DISK, 5, 0, 10)  # demote: another pair of tiers
    plan.add(HOST, DISK, 6, 1, 11)
    plan.add(HOST, DISK, 7, 0, 12)  # writes disk slot 0 again: after the first write
    plan.add(DEVICE, HOST, 1, 6, 13)
    assert [(op.src, op.dst, op.dst_slots) for op in plan.ops] == [
        (DEVICE, HOST, [5]),
        (HOST, DISK, [0, 1]),
        (HOST, DISK, [0]),
        (DEVICE, HOST, [6]),
    ]
    assert [entry for op in plan.ops for entry in op.entries] == [
        (10, 5),
        (10, 0),
        (11, 1),
        (12, 0),
        (13, 6),
    ]
