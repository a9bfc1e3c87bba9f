"""Host cores shared in time slices: who is on a core when, and for how long."""

from __future__ import annotations

import pytest

from tandem.sim.events import EventQueue
from tandem.sim.sliced_cores import SlicedCores

MS = 1e-3


class Host:
    """Cores and the owners of the work on them (kept alive: work is keyed by id)."""

    def __init__(self, cores: int, **kwargs) -> None:
        self.events = EventQueue()
        self.cores = SlicedCores(self.events, cores, slice_s=3 * MS, **kwargs)
        self.owners: dict[str, object] = {}
        self.ends: dict[str, float] = {}

    def start(self, name: str, work_ms: float, at_ms: float = 0.0, **kwargs) -> None:
        owner = self.owners.setdefault(name, object())
        self.events.at(at_ms * MS, self._start, owner, work_ms * MS, name, kwargs)

    def _start(self, owner: object, work_s: float, name: str, kwargs: dict) -> None:
        self.cores.start(owner, work_s, self._ended, name, **kwargs)

    def _ended(self, name: str) -> None:
        self.ends[name] = self.events.now

    def run(self) -> dict[str, float]:
        self.events.run()
        assert self.cores.num_stepping == 0
        return {name: t / MS for name, t in self.ends.items()}


def test_work_that_waits_gets_the_core_when_a_slice_ends_in_turn():
    # one core, three pieces of 4.5 ms: 3 ms each in turn, then the 1.5 ms left in turn
    host = Host(1)
    for name in "abc":
        host.start(name, 4.5)
    assert host.run() == pytest.approx({"a": 10.5, "b": 12.0, "c": 13.5})


def test_work_alone_keeps_its_core_past_its_slice():
    host = Host(1)
    host.start("a", 10.0)
    host.start("b", 1.0, at_ms=12.0)
    assert host.run() == pytest.approx({"a": 10.0, "b": 13.0})


def test_work_that_yields_sooner_waits_behind_the_rest():
    # an engine thread that leaves its core after 1 ms (the interpreter lock) beside work
    # that keeps it for the kernel's 3 ms: it runs 0-1, waits 1-4, ends 4-6
    host = Host(1)
    host.start("engine", 3.0, slice_s=1 * MS)
    host.start("other", 3.0)
    assert host.run() == pytest.approx({"engine": 6.0, "other": 4.0})


def test_two_threads_of_one_process_never_run_at_once():
    # two cores, but one interpreter lock: the second waits for the first's slice although
    # a core is free; another process's work takes that core
    host = Host(2)
    node = object()
    host.start("engine", 3.0, process=node)
    host.start("http", 3.0, process=node)
    host.start("router", 2.0)
    assert host.run() == pytest.approx({"engine": 3.0, "http": 6.0, "router": 2.0})


def test_a_stopped_piece_never_ends_and_frees_its_core():
    host = Host(1)
    host.start("dead", 10.0)
    host.start("alive", 2.0)
    host.events.at(1 * MS, lambda: host.cores.stop(host.owners["dead"]))
    assert host.run() == pytest.approx({"alive": 3.0})


def test_no_cores_means_a_device_each():
    host = Host(0)
    host.start("a", 5.0)
    host.start("b", 5.0, at_ms=1.0)
    assert host.run() == pytest.approx({"a": 5.0, "b": 6.0})


def test_a_decode_step_runs_slower_beside_a_prefill_step_on_a_core():
    # two cores, interference 0.5: the decode step's 3 ms take 4.5 ms while the prefill
    # step runs beside it; other tenants' half a core slows both to 2 / 2.5 of a core
    host = Host(2, interference=0.5)
    host.start("prefill", 10.0, role="prefill")
    host.start("decode", 3.0, role="decode")
    assert host.run() == pytest.approx({"prefill": 10.0, "decode": 4.5})
    loaded = Host(2, background=0.5)
    loaded.start("a", 4.0)
    loaded.start("b", 4.0)
    assert loaded.run() == pytest.approx({"a": 5.0, "b": 5.0})


def test_a_slice_must_be_positive():
    with pytest.raises(ValueError, match="slice"):
        SlicedCores(EventQueue(), 2, slice_s=0.0)
