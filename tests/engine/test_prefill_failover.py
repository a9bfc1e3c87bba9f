"""The decode node's fail-over code on its own, on a real scheduler, with the clock passed in
and aborts sent to a recording callback: the decisions, the deadlines, the holds and the
abort resends that `DecodeNode` and the simulator's `SimDecode` both rely on."""

from __future__ import annotations

import pytest

from tandem.engine.core.request import Request, RequestStatus
from tandem.engine.core.scheduler import RemoteHold
from tandem.engine.transfer.prefill_failover import (
    ABORT_RESEND_S,
    DecodeOptions,
    HoldExpiry,
    PrefillFailover,
)
from tests.engine.test_scheduler import make_scheduler, request

P1, P2, P3 = "tcp://p1", "tcp://p2", "tcp://p3"


class Aborts:
    """Records the aborts sent; `down` workers are not connected."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []
        self.down: set[str] = set()

    def __call__(self, hold: RemoteHold) -> bool:
        if hold.worker in self.down:
            return False
        self.sent.append((hold.worker, hold.key))
        return True


def setup(**options) -> tuple[PrefillFailover, Aborts]:
    aborts = Aborts()
    return PrefillFailover(make_scheduler(), DecodeOptions(**options), aborts), aborts


def send_remote(failover: PrefillFailover, now: float, prefill=P1, alternates=()) -> Request:
    """A request admitted for remote prefill and sent to `prefill` at `now`."""
    r = request(f"r{len(failover.attempts)}", 16)
    r.prefill_worker = prefill
    failover.track(r, [prefill, *alternates])
    failover.scheduler.add_request(r)
    assert failover.scheduler.schedule().remote_prefills == [r]
    failover.sent(r, now)
    return r


def resend(failover: PrefillFailover, r: Request, now: float) -> None:
    """The scheduler admits the request again (a retry) and it is sent at `now`."""
    assert failover.scheduler.schedule().remote_prefills == [r]
    failover.sent(r, now)


def test_one_retry_on_an_untried_alternate_then_local_prefill():
    failover, _ = setup()
    r = send_remote(failover, 0.0, alternates=(P1, P2, P3))
    first = failover.fall_back(r.request_id, "timeout")
    assert (first.retry_on, first.local, first.action) == (P2, False, f"retrying on {P2}")
    assert r.prefill_worker == P2 and r.status == RequestStatus.PREEMPTED
    resend(failover, r, 1.0)
    second = failover.fall_back(r.request_id, "error")
    assert second.local and not second.failed and second.action == "prefilling locally"
    assert r.prefill_worker is None  # P3 is never tried: one retry only
    out = failover.scheduler.schedule()
    assert out.scheduled == [r] and not out.remote_prefills
    failover.scheduler.kv.check_integrity()


def test_with_fail_the_request_ends_in_error_and_is_forgotten():
    failover, _ = setup(on_prefill_failure="fail")
    r = send_remote(failover, 0.0)  # no alternate
    decision = failover.fall_back(r.request_id, "disconnected")
    assert decision.failed and decision.action == "failing it"
    assert r.status == RequestStatus.FINISHED_ERROR and r.request_id not in failover.attempts
    assert failover.kv.hold_keys() == [f"{r.request_id}@1"]  # the attempt may still write


def test_an_attempt_is_overdue_from_its_deadline_and_a_retry_gets_a_fresh_one():
    failover, _ = setup(prefill_timeout_s=5.0)
    r = send_remote(failover, 10.0, alternates=(P2,))
    assert failover.next_due() == 15.0
    assert failover.overdue(14.9) == [] and failover.overdue(15.0) == [r]
    failover.fall_back(r.request_id, "timeout")
    resend(failover, r, 15.0)
    assert failover.overdue(19.9) == [] and failover.overdue(20.0) == [r]
    assert failover.current(r.request_id, 2) is r and failover.current(r.request_id, 1) is None
    assert failover.waiting_on(P2) == [r] and failover.waiting_on(P1) == []


def test_an_abandoned_attempt_is_held_aborted_and_aborted_again_until_confirmed():
    failover, aborts = setup(hold_timeout_s=100.0)
    r = send_remote(failover, 0.0)
    failover.fall_back(r.request_id, "timeout")  # local prefill; attempt 1 is abandoned
    key = f"{r.request_id}@1"
    assert failover.send_aborts(0.0) == [] and aborts.sent == [(P1, key)]
    assert failover.kv.is_held(key) and failover.unconfirmed.keys() == {key}
    assert failover.next_due() == ABORT_RESEND_S  # the resend comes before the hold timeout
    failover.send_aborts(ABORT_RESEND_S / 2)
    assert len(aborts.sent) == 1  # not due yet
    failover.send_aborts(ABORT_RESEND_S)
    assert aborts.sent == [(P1, key)] * 2
    failover.release(key)  # the worker confirmed
    assert not failover.kv.hold_keys() and not failover.unconfirmed and not failover.hold_deadlines
    assert failover.next_due() is None
    failover.send_aborts(10.0)
    assert len(aborts.sent) == 2
    failover.kv.check_integrity()


def abandoned_hold(failover: PrefillFailover, now: float) -> str:
    """A request sent to P1 and aborted by its client at `now`: the key of its hold."""
    r = send_remote(failover, now)
    failover.scheduler.finish_requests([r.request_id], RequestStatus.FINISHED_ABORTED)
    failover.forget(r.request_id)
    failover.send_aborts(now)
    return f"{r.request_id}@1"


def test_an_abort_that_cannot_be_sent_is_reported_and_its_hold_times_out():
    failover, aborts = setup(hold_timeout_s=30.0)
    aborts.down.add(P1)
    r = send_remote(failover, 0.0)
    failover.scheduler.finish_requests([r.request_id], RequestStatus.FINISHED_ABORTED)
    failover.forget(r.request_id)
    unsent = failover.send_aborts(2.0)
    assert [h.key for h in unsent] == [f"{r.request_id}@1"] and aborts.sent == []
    assert failover.expire_holds(31.9) == []
    assert failover.expire_holds(32.0) == [HoldExpiry(unsent[0].key, P1, quarantined=True)]
    failover.release(unsent[0].key)
    assert failover.kv.check_integrity().in_use == 0 and not failover.kv.hold_keys()


def test_a_timed_out_hold_is_quarantined_until_its_worker_confirms_late():
    failover, aborts = setup(hold_timeout_s=10.0)
    key = abandoned_hold(failover, 0.0)
    num_blocks = failover.kv.num_held_blocks
    assert failover.expire_holds(10.0) == [HoldExpiry(key, P1, quarantined=True)]
    # Not freed: still held, counted apart, and not in the free pool.
    assert failover.kv.is_held(key) and failover.is_quarantined(key)
    assert failover.num_quarantined_blocks == num_blocks > 0
    counts = failover.kv.check_integrity()
    assert counts.in_use == num_blocks and counts.free + counts.cached == counts.total - num_blocks
    # No deadline is left, but the abort is still resent while the worker is silent.
    assert failover.expire_holds(1e9) == [] and failover.next_due() == failover.next_resend
    sent = len(aborts.sent)
    failover.send_aborts(failover.next_resend)
    assert aborts.sent[sent:] == [(P1, key)]
    failover.release(key)  # its AbortAck (or PrefillDone, PrefillFailed) arrives
    assert failover.num_quarantined_blocks == 0 and not failover.kv.hold_keys()
    assert failover.kv.check_integrity().in_use == 0 and failover.next_due() is None


def test_a_lost_writer_releases_its_quarantined_holds_and_no_other():
    failover, _ = setup(hold_timeout_s=10.0)
    other = send_remote(failover, 0.0, prefill=P2)
    failover.fall_back(other.request_id, "timeout")
    key = abandoned_hold(failover, 0.0)
    failover.send_aborts(0.0)
    failover.expire_holds(10.0)
    assert failover.quarantined == {key, f"{other.request_id}@1"}
    assert failover.writer_lost(P1) == [key]
    assert not failover.kv.is_held(key) and failover.quarantined == {f"{other.request_id}@1"}
    failover.kv.check_integrity()


def test_a_hold_whose_writer_was_lost_is_released_at_its_timeout_not_quarantined():
    failover, _ = setup(hold_timeout_s=10.0)
    key = abandoned_hold(failover, 0.0)
    assert failover.writer_lost(P1) == []  # still within its timeout: a successor may confirm
    assert failover.kv.is_held(key)
    assert failover.expire_holds(10.0) == [HoldExpiry(key, P1, quarantined=False)]
    assert not failover.kv.hold_keys() and not failover.quarantined and not failover.lost
    assert failover.kv.check_integrity().in_use == 0


def test_a_hold_released_before_its_abort_is_sent_is_not_aborted():
    """A failure report arrives before the step sends the abort: nothing is in flight."""
    failover, aborts = setup()
    r = send_remote(failover, 0.0)
    failover.fall_back(r.request_id, "error")
    failover.release(f"{r.request_id}@1")
    assert failover.send_aborts(0.0) == [] and aborts.sent == [] and not failover.unconfirmed


@pytest.mark.parametrize(
    "bad",
    [{"on_prefill_failure": "retry"}, {"prefill_timeout_s": 0.0}, {"remote_prefill_threshold": -1}],
)
def test_bad_options_are_refused(bad):
    with pytest.raises(ValueError):
        DecodeOptions(**bad)
