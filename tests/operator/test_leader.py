"""Leader election over a Lease: one holder at a time, takeover only after expiry."""

from __future__ import annotations

import threading

import pytest

from tandem.operator.kinds import LEASE
from tandem.operator.kube import ApiError
from tandem.operator.leader import LeaderElector, LeaseState, lease_state, may_take
from tests.operator.fake_api import FakeApi


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def electors(api, clock, *names):
    return [LeaderElector(api, "ops", "tandem-operator", n, duration_s=15, retry_s=0.01,
                          clock=clock) for n in names]  # fmt: skip


class HangingApi(FakeApi):
    """Once `hanging`, every lease call takes its whole timeout on `clock` (30 s unless
    told less, as a real call may) and then fails."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock, self.hanging, self.timeouts = clock, False, []

    def _hang(self, timeout_s: float | None) -> None:
        if self.hanging:
            self.timeouts.append(timeout_s)
            self.clock.now += 30.0 if timeout_s is None else timeout_s
            raise ApiError(503, "ReadTimeoutError")

    def get(self, kind, namespace, name, timeout_s=None):
        self._hang(timeout_s)
        return super().get(kind, namespace, name)

    def replace(self, kind, namespace, body, timeout_s=None):
        self._hang(timeout_s)
        return super().replace(kind, namespace, body)


def test_may_take():
    assert may_take(None, "a", 0.0)
    assert may_take(LeaseState("a", 100.0, 15), "a", 101.0)
    assert not may_take(LeaseState("b", 100.0, 15), "a", 114.9)
    assert may_take(LeaseState("b", 100.0, 15), "a", 115.0)


def test_one_leader_until_its_lease_expires():
    api, clock = FakeApi(), Clock()
    a, b = electors(api, clock, "a", "b")
    assert a.try_acquire()
    assert not b.try_acquire()
    clock.now += 10
    assert a.try_acquire()  # renew
    clock.now += 10
    assert not b.try_acquire()  # renewed 10 s ago
    clock.now += 16
    assert b.try_acquire()  # a stopped renewing
    lease = api.get(LEASE, "ops", "tandem-operator")
    assert lease["spec"]["holderIdentity"] == "b" and lease["spec"]["leaseTransitions"] == 1
    assert not a.try_acquire()


def test_a_stale_write_loses_the_race():
    api, clock = FakeApi(), Clock()
    (a,) = electors(api, clock, "a")
    assert a.try_acquire()
    original_get = api.get

    def get_then_someone_writes(kind, ns, name, timeout_s=None):
        seen = original_get(kind, ns, name)
        api.replace(LEASE, ns, original_get(kind, ns, name))  # another writer, first
        return seen

    api.get = get_then_someone_writes
    assert not a.try_acquire()  # 409 on the stale resourceVersion


def test_a_leader_that_cannot_renew_gives_up():
    api, clock = FakeApi(), Clock()
    a, b = electors(api, clock, "a", "b")
    stop = threading.Event()
    assert a.wait_until_leader(stop)
    clock.now += 20
    assert b.try_acquire()  # a was paused past its lease

    def ticking() -> float:  # five seconds pass between a's attempts
        clock.now += 5
        return clock.now

    a.clock = ticking
    b.duration_s = 3600  # b's lease outlives the test
    assert b.try_acquire()
    lost = threading.Event()
    a.keep_leading(stop, lost.set)  # returns once renewing failed for a lease duration
    assert lost.is_set()


def test_waiting_stops_on_request():
    api, clock = FakeApi(), Clock()
    a, b = electors(api, clock, "a", "b")
    assert a.try_acquire()
    stop = threading.Event()
    threading.Timer(0.05, stop.set).start()
    assert b.wait_until_leader(stop) is False


def test_a_released_lease_is_taken_at_once_and_only_the_holder_releases():
    api, clock = FakeApi(), Clock()
    a, b = electors(api, clock, "a", "b")
    assert a.try_acquire()
    b.release()  # not the holder: changes nothing
    assert not b.try_acquire()
    a.release()
    assert api.get(LEASE, "ops", "tandem-operator")["spec"]["holderIdentity"] == ""
    assert b.try_acquire()  # no wait for the 15 s expiry
    a.release()  # b holds it now
    assert api.get(LEASE, "ops", "tandem-operator")["spec"]["holderIdentity"] == "b"


def test_the_renew_deadline_is_shorter_than_the_lease():
    with pytest.raises(ValueError, match="less than the lease duration"):
        LeaderElector(FakeApi(), "ops", "l", "a", duration_s=15, renew_deadline_s=15)
    elector = LeaderElector(FakeApi(), "ops", "l", "a")
    assert (elector.duration_s, elector.renew_deadline_s, elector.retry_s) == (15, 10, 2)


def test_a_leader_whose_renewals_hang_steps_down_before_others_may_take_over():
    clock = Clock()
    api = HangingApi(clock)
    (a,) = electors(api, clock, "a")
    stop = threading.Event()
    assert a.wait_until_leader(stop)
    lease = lease_state(api.get(LEASE, "ops", "tandem-operator"))
    api.hanging = True
    stepped_down_at = []
    a.keep_leading(stop, lambda: stepped_down_at.append(clock.now))
    assert stepped_down_at, "the leader never stepped down"
    assert not may_take(lease, "b", stepped_down_at[0])  # b still waits: no overlap
    assert all(t is not None and t <= a.renew_deadline_s for t in api.timeouts)


def test_a_lost_lease_exits_without_waiting_for_a_running_reconcile():
    from tandem.operator.lifecycle import EXIT_TIMEOUT_S, Run, wait_for_stop

    class HungKopf:  # kopf's thread, with a reconcile that does not end
        def __init__(self) -> None:
            self.waited: list[float] = []

        def join(self, timeout: float) -> None:
            self.waited.append(timeout)

        def is_alive(self) -> bool:
            return True

    lost, stopped = Run(), Run()
    lost.fail("lost the leader lease", at_once=True)
    stopped.stop.set()  # SIGTERM
    for run, grace in ((lost, 0), (stopped, EXIT_TIMEOUT_S)):
        kopf = HungKopf()
        assert wait_for_stop(run, kopf) is False
        assert kopf.waited == [grace]
    assert lost.exit_code() == 1 and stopped.exit_code() == 0


class FakeStop(threading.Event):
    """`stop` whose waits pass on the fake clock, not in real time."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock

    def wait(self, timeout=None) -> bool:
        if not self.is_set():
            self.clock.now += timeout
        return self.is_set()


def test_a_leader_steps_down_at_its_deadline_while_a_renewal_call_hangs_on():
    """A call that ignores its timeout (an HTTP client's retries, a DNS lookup) does not
    hold the step-down back: a watchdog apart from the renewing thread acts."""
    clock = Clock()
    api = HangingApi(clock)
    (a,) = electors(api, clock, "a")
    a.retry_s = 2.0
    assert a.wait_until_leader(threading.Event())
    lease = lease_state(api.get(LEASE, "ops", "tandem-operator"))
    release = threading.Event()

    def hang_forever(timeout_s) -> None:
        release.wait()  # until the test ends
        raise ApiError(503, "released")

    api._hang = hang_forever
    stop, lost = FakeStop(clock), threading.Event()
    stepped_down_at = []
    leader = threading.Thread(
        target=a.keep_leading, args=(stop, lambda: (stepped_down_at.append(clock.now), lost.set()))
    )
    leader.start()
    try:
        assert lost.wait(60), "the leader never stepped down"  # a guard against a hang
        assert not may_take(lease, "b", stepped_down_at[0])
    finally:
        stop.set()
        release.set()
        leader.join()
