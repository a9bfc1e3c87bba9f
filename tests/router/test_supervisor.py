"""`tandem serve`'s supervisor with stand-in children (sleeping Python processes) and an
explicit clock: a child that dies is restarted after its back-off, on the same command
line; one that crashes too often gives up; `stop()` ends them all."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import deque

import pytest

from tandem.router.supervisor import Child, GaveUp, RestartPolicy, Supervisor, describe_exit

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


def test_backoff_doubles_up_to_its_cap_and_the_window_forgets_old_crashes():
    policy = RestartPolicy(max_restarts=5, window_s=60, backoff_s=1, max_backoff_s=4)
    crashes: deque[float] = deque()
    assert [policy.delay(crashes, t) for t in (0, 1, 2, 3, 4)] == [1, 2, 4, 4, 4]
    assert policy.delay(crashes, 5) is None  # the sixth crash within 60 s
    assert policy.delay(crashes, 62.5) == 4  # those of 0, 1 and 2 s have left the window
    assert list(crashes) == [3, 4, 5, 62.5]


def test_zero_restarts_gives_up_at_the_first_crash():
    assert RestartPolicy(max_restarts=0).delay(deque(), 0.0) is None


@pytest.mark.parametrize(
    "kwargs", [{"max_restarts": -1}, {"window_s": 0}, {"backoff_s": 5, "max_backoff_s": 1}]
)
def test_an_invalid_policy_is_refused(kwargs):
    with pytest.raises(ValueError):
        RestartPolicy(**kwargs)


def test_exits_are_described_by_code_or_signal():
    assert describe_exit(3) == "exited with 3"
    assert describe_exit(-signal.SIGKILL) == "was killed by SIGKILL"


@pytest.fixture
def supervised():
    lines: list[str] = []
    children = [Child("a", SLEEPER, "http://a"), Child("b", SLEEPER, "http://b")]
    policy = RestartPolicy(max_restarts=1, window_s=60, backoff_s=1)
    supervisor = Supervisor(children, policy, os.environ, log=lines.append)
    supervisor.start()
    yield supervisor, lines
    supervisor.stop()


def kill(child: Child) -> None:
    child.proc.kill()
    child.proc.wait()


def test_a_killed_child_is_restarted_after_its_backoff(supervised):
    supervisor, lines = supervised
    a, b = supervisor.children
    first, other = a.proc.pid, b.proc.pid
    kill(a)
    supervisor.tick(100.0)
    assert a.restart_at == 101.0 and a.proc.pid == first
    assert lines == [
        f"a (pid {first}) was killed by SIGKILL; restarting in 1 s "
        "(crash 1 of at most 1 within 60 s)"
    ]
    supervisor.tick(100.5)
    assert a.proc.pid == first and supervisor.dead() is None  # waiting, not dead
    supervisor.tick(101.0)
    assert a.proc.pid != first and a.proc.poll() is None and a.restarts == 1
    assert a.proc.args == SLEEPER and lines[-1] == f"a restarted (pid {a.proc.pid})"
    assert b.proc.pid == other and b.restarts == 0  # the others are left alone


def test_a_child_crashing_too_often_gives_up(supervised):
    supervisor, _ = supervised
    a = supervisor.children[0]
    kill(a)
    supervisor.tick(0.0)
    supervisor.tick(1.0)
    kill(a)
    with pytest.raises(GaveUp, match=r"a \(pid \d+\) was killed by SIGKILL: 2 crashes"):
        supervisor.tick(2.0)


def test_stop_ends_every_child(supervised):
    supervisor, _ = supervised
    kill(supervisor.children[0])
    supervisor.tick(0.0)  # one is waiting for its restart when everything stops
    supervisor.stop()
    assert all(c.proc.poll() is not None for c in supervisor.children)


def test_before_the_router_is_ready_a_killed_child_is_restarted_but_a_failed_one_is_fatal(
    supervised,
):
    """The supervisor notices readiness a moment after its clients may: a child they killed
    then is a crash, not a start-up failure. One that exits by itself (a bad flag, a port in
    use) is fatal at once."""
    supervisor, lines = supervised
    a, b = supervisor.children
    killed = a.proc.pid
    kill(a)
    supervisor._startup_round(100.0)
    assert a.restart_at == 101.0 and "was killed by SIGKILL; restarting" in lines[-1]
    supervisor._startup_round(101.0)
    assert a.proc.pid != killed and a.proc.poll() is None
    kill(b)
    b.proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(2)"])  # a bad flag
    b.proc.wait()
    with pytest.raises(RuntimeError, match="b exited with 2"):
        supervisor._startup_round(102.0)
