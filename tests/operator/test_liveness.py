"""`/healthz` and fatal errors from the API liveness checks, on a clock the test turns."""

from __future__ import annotations

import threading

from tandem.operator.kube import ApiError
from tandem.operator.liveness import ApiLiveness


class Script:
    """A probe that fails with the status the test sets (None: succeeds)."""

    def __init__(self) -> None:
        self.status: int | None = None

    def __call__(self) -> None:
        if self.status is not None:
            raise ApiError(self.status, "scripted")


def liveness() -> tuple[ApiLiveness, Script, list[float]]:
    now, script = [0.0], Script()
    return ApiLiveness(script, period_s=1, grace_s=10, clock=lambda: now[0]), script, now


def test_unreachable_for_longer_than_the_grace_fails_healthz_and_recovers():
    live, script, now = liveness()
    script.status = 503
    for t in range(1, 11):
        now[0] = t
        live.check()
        assert live.health().ok, t  # within the grace
    now[0] = 11
    live.check()
    health = live.health()
    assert not health.ok and "503: scripted" in health.detail
    assert live.fatal() is None  # an absent server is not fatal: the kubelet decides
    script.status = None
    live.check()
    assert live.health().ok


def test_credentials_refused_for_the_grace_are_fatal_but_a_blip_is_not():
    live, script, now = liveness()
    script.status = 401
    live.check()
    now[0] = 5
    script.status = None
    live.check()  # accepted again: the 401 was a blip (e.g. a token being rotated)
    script.status = 401
    for t in (6, 12, 15):
        now[0] = t
        live.check()
    assert live.fatal() is None  # refused since t=6, for 9 s
    now[0] = 16
    live.check()
    assert "refuses our credentials" in live.fatal()


def test_other_errors_reset_the_refusal_clock():
    live, script, now = liveness()
    script.status = 401
    live.check()
    now[0], script.status = 9, 503  # the server went away; no longer a refusal
    live.check()
    now[0], script.status = 12, 401
    live.check()
    assert live.fatal() is None


def test_run_reports_the_fatal_reason_once_and_returns():
    live, script, now = liveness()
    live.period_s = 0.0
    script.status = 401
    reasons: list[str] = []
    stop = threading.Event()

    def fail(reason: str) -> None:
        reasons.append(reason)

    original = live.check

    def check_and_tick() -> None:
        now[0] += 4
        original()

    live.check = check_and_tick
    live.run(stop, fail)  # returns by itself once fatal
    assert len(reasons) == 1 and "401" in reasons[0]
