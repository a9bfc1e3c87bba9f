"""A single-threaded process on the host's cores: one item at a time, in order, one share."""

import pytest

from tandem.sim.events import EventQueue
from tandem.sim.host_process import HostProcess
from tandem.sim.shared_cores import SharedCores


def test_items_run_one_at_a_time_in_the_order_they_came():
    # two cores, nothing else on them: three items of 0.1 s submitted together end at 0.1,
    # 0.2 and 0.3 (as tasks side by side all three would end at 0.15)
    events = EventQueue()
    process = HostProcess(SharedCores(events, 2))
    ends: list[tuple[str, float]] = []
    for name in "abc":
        process.submit(0.1, lambda n: ends.append((n, events.now)), name)
    assert process.queued == 3
    events.run()
    assert [n for n, _ in ends] == ["a", "b", "c"]
    assert [t for _, t in ends] == [pytest.approx(0.1), pytest.approx(0.2), pytest.approx(0.3)]
    assert process.queued == 0 and process.busy_s == pytest.approx(0.3)


def test_a_process_takes_one_share_of_the_cores():
    # one core: a step of 1 s and, from 0, a process with two items of 0.25 s: the step and
    # the process share the core (the items end at 0.5 and 1.0), then the step runs alone
    # with 0.5 s of work left until 1.5
    events = EventQueue()
    cores = SharedCores(events, 1)
    process = HostProcess(cores)
    ends: list[float] = []
    cores.start(object(), 1.0, lambda: ends.append(events.now))
    for _ in range(2):
        process.submit(0.25, lambda: ends.append(events.now))
    events.run()
    assert sorted(ends) == [pytest.approx(0.5), pytest.approx(1.0), pytest.approx(1.5)]
    assert cores.num_stepping == 0


def test_no_work_or_no_simulated_cores_follows_at_once():
    events = EventQueue()
    done: list[str] = []
    HostProcess(SharedCores(events, 0)).submit(1.0, done.append, "own cores")
    idle = HostProcess(SharedCores(events, 2))
    idle.submit(0.0, done.append, "nothing to do")
    assert done == ["own cores", "nothing to do"] and not events._heap
    # while busy, even an item of no work waits its turn behind the others
    idle.submit(0.1, done.append, "work")
    idle.submit(0.0, done.append, "after it")
    assert done == ["own cores", "nothing to do"]
    events.run()
    assert done[2:] == ["work", "after it"]
