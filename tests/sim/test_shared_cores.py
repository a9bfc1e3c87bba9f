import pytest

from tandem.sim.events import EventQueue
from tandem.sim.shared_cores import SharedCores


def _run(cores: int, background: float, steps: list[tuple[float, str, float]]) -> dict[str, float]:
    """Steps (start time, name, work alone); when each ends."""
    events = EventQueue()
    shared = SharedCores(events, cores, background)
    ends: dict[str, float] = {}
    owners = []  # kept alive: the cores key a step by its owner's id
    for at, name, work in steps:
        owner = object()
        owners.append(owner)
        ends[name] = -1.0
        events.at(at, shared.start, owner, work, lambda n: ends.__setitem__(n, events.now), name)
    events.run()
    assert shared.num_stepping == 0
    return ends


def test_a_step_slows_down_while_another_joins_it_and_speeds_up_when_it_leaves():
    # one core: A alone for 1 s (1 s of work left), then A and B at half speed each
    # until B's 0.5 s are done at 2.0 (A has 0.5 s left), then A alone until 2.5
    ends = _run(1, 0.0, [(0.0, "a", 2.0), (1.0, "b", 0.5)])
    assert ends["b"] == pytest.approx(2.0)
    assert ends["a"] == pytest.approx(2.5)


def test_steps_within_the_core_count_run_at_full_speed():
    ends = _run(2, 0.0, [(0.0, "a", 1.0), (0.0, "b", 1.0)])
    assert ends == {"a": pytest.approx(1.0), "b": pytest.approx(1.0)}


def test_other_tenants_take_their_share():
    # two cores, 1.5 busy with other work: two steps share 2 / 3.5 of a core each
    ends = _run(2, 1.5, [(0.0, "a", 1.0), (0.0, "b", 1.0)])
    assert ends == {"a": pytest.approx(1.75), "b": pytest.approx(1.75)}


def test_no_cores_means_a_device_each():
    ends = _run(0, 3.0, [(0.0, "a", 1.0), (0.5, "b", 1.0), (0.5, "c", 2.0)])
    assert ends == {"a": pytest.approx(1.0), "b": pytest.approx(1.5), "c": pytest.approx(2.5)}


def test_a_stopped_step_never_ends_and_frees_its_share():
    events = EventQueue()
    shared = SharedCores(events, 1)
    ends: list[tuple[str, float]] = []
    dead, alive = object(), object()
    shared.start(dead, 1.0, lambda n: ends.append((n, events.now)), "dead")
    shared.start(alive, 1.0, lambda n: ends.append((n, events.now)), "alive")
    events.at(1.0, shared.stop, dead)  # both half done; then alive alone: 0.5 s more
    events.run()
    assert [n for n, _ in ends] == ["alive"]
    assert ends[0][1] == pytest.approx(1.5)


def test_prefill_steps_beside_a_decode_step_slow_its_work():
    # four cores (no step waits for one), interference 0.25: a decode step of 1 s of work
    # runs alone for 0.5 s, then beside two prefill steps at 1 / 1.5 of its speed, so its
    # last 0.5 s take 0.75 s; the prefill steps are not slowed
    events = EventQueue()
    shared = SharedCores(events, 4, interference=0.25)
    ends: dict[str, float] = {}
    owners = {name: object() for name in ("decode", "p1", "p2")}  # alive: keyed by id

    def start(name: str, work: float, role: str) -> None:
        shared.start(owners[name], work, lambda: ends.__setitem__(name, events.now), role=role)

    start("decode", 1.0, "decode")
    events.at(0.5, start, "p1", 2.0, "prefill")
    events.at(0.5, start, "p2", 2.0, "prefill")
    events.run()
    assert ends == {
        "decode": pytest.approx(1.25),
        "p1": pytest.approx(2.5),
        "p2": pytest.approx(2.5),
    }
    assert shared.rate_of("decode") == shared.rate() == 1.0  # nothing runs any more


@pytest.mark.parametrize(
    ("cores", "expected"),
    [
        (1, {"engine": 3.0, "http": 3.0, "other": 2.0}),
        (4, {"engine": 2.0, "http": 2.0, "other": 1.0}),
    ],
)
def test_two_threads_of_one_process_take_turns_on_one_share(cores, expected):
    # The engine thread and the HTTP thread of one process (1 s of work each) and another
    # process (1 s). One core: two processes, half the core each, the first's half shared
    # by its threads; when the other ends at 2 s (each thread has done 0.5 s) the threads
    # have the core, half each, and end at 3 s. Four cores: the process still gets one.
    events = EventQueue()
    shared = SharedCores(events, cores)
    ends: dict[str, float] = {}

    def ended(name: str) -> None:
        ends[name] = events.now

    owners = {name: object() for name in expected}  # alive: keyed by id
    node = owners["engine"]
    for name, process in (("engine", node), ("http", node), ("other", None)):
        shared.start(owners[name], 1.0, ended, name, process=process)
    events.run()
    assert ends == pytest.approx(expected)
