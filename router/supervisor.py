"""The process supervisor behind `tandem serve`: starts its children, restarts one that dies
(same command line, so the same ports) under a bounded policy, and stops them all together.

Like a Kubernetes pod with `restartPolicy: Always`: any exit of a running child counts as a
crash and is restarted after a back-off that doubles with each recent crash; a child that
crashes too often within a window makes the supervisor give up (`GaveUp`), and the caller
stops everything. A child that exits by itself before the router is first ready is a
start-up failure (a bad flag, a port in use): fatal at once, never retried. One killed by a
signal meanwhile (kill -9, the OOM killer) crashed: it is restarted like any crash, since
the supervisor notices readiness a moment after its clients may.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import httpx


@dataclass(frozen=True)
class RestartPolicy:
    """When a crashed child is restarted: `backoff_s` after its first crash within
    `window_s`, doubled for each further one, at most `max_backoff_s`; its
    `max_restarts + 1`-th crash within `window_s` gives up (0: never restart)."""

    max_restarts: int = 5
    window_s: float = 60.0
    backoff_s: float = 1.0
    max_backoff_s: float = 16.0

    def __post_init__(self) -> None:
        if self.max_restarts < 0 or self.window_s <= 0:
            raise ValueError("max_restarts must be >= 0 and window_s > 0")
        if not 0 <= self.backoff_s <= self.max_backoff_s:
            raise ValueError("need 0 <= backoff_s <= max_backoff_s")

    def delay(self, crashes: deque[float], now: float) -> float | None:
        """Record a crash at `now` in `crashes` (the child's recent crash times, which this
        trims to the window); seconds to wait before restarting, or None to give up."""
        while crashes and crashes[0] <= now - self.window_s:
            crashes.popleft()
        crashes.append(now)
        if len(crashes) > self.max_restarts:
            return None
        return min(self.max_backoff_s, self.backoff_s * 2 ** (len(crashes) - 1))


@dataclass
class Child:
    """One supervised process: its name, command line and HTTP address; `proc` is the
    current process (None before start), `restart_at` when a pending restart is due."""

    name: str
    cmd: list[str]
    url: str
    extra: str = ""
    proc: subprocess.Popen | None = field(default=None, repr=False)
    crashes: deque[float] = field(default_factory=deque, repr=False)
    restart_at: float | None = None
    restarts: int = 0


class GaveUp(RuntimeError):
    """A child crashed more often than the restart policy allows."""


def describe_exit(code: int) -> str:
    """'exited with 1' or 'was killed by SIGKILL' for a Popen return code."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with {code}"


def _say(line: str) -> None:
    print(f"tandem serve: {line}", file=sys.stderr, flush=True)


class Supervisor:
    """Owns the children's processes. `tick()` is one supervision round (notice exits,
    restart those whose back-off passed); `watch()` repeats it until `GaveUp`."""

    def __init__(
        self,
        children: list[Child],
        policy: RestartPolicy,
        env: Mapping[str, str],
        log: Callable[[str], None] = _say,
    ) -> None:
        self.children = children
        self.policy = policy
        self.env = dict(env)
        self.log = log

    def start(self) -> None:
        for child in self.children:
            self._spawn(child)

    def _spawn(self, child: Child) -> None:
        child.proc = subprocess.Popen(child.cmd, env=self.env)
        child.restart_at = None

    def dead(self) -> Child | None:
        """A child whose process has exited and is not scheduled for a restart."""
        return next(
            (c for c in self.children if c.restart_at is None and c.proc.poll() is not None),
            None,
        )

    def wait_ready(self, router: Child, timeout: float) -> None:
        """Wait until the router answers /health with 200. Raises RuntimeError when a child
        exits by itself first (start-up failures are not restarted), GaveUp when one is
        killed more often than the policy allows, TimeoutError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._startup_round(time.monotonic())
            try:
                if httpx.get(f"{router.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"not ready after {timeout:.0f}s")

    def _startup_round(self, now: float) -> None:
        for child in self.children:
            code = child.proc.poll() if child.restart_at is None else None
            if code is not None and code >= 0:
                raise RuntimeError(f"{child.name} {describe_exit(code)}")
        self.tick(now)  # killed by a signal: a crash

    def tick(self, now: float) -> None:
        """Schedule a restart for every child that died, and restart every child whose
        back-off is over. Raises GaveUp when one crashed too often."""
        for child in self.children:
            if child.restart_at is None and child.proc.poll() is not None:
                self._schedule(child, now)
            elif child.restart_at is not None and now >= child.restart_at:
                self._spawn(child)
                child.restarts += 1
                self.log(f"{child.name} restarted (pid {child.proc.pid})")

    def _schedule(self, child: Child, now: float) -> None:
        how = f"{child.name} (pid {child.proc.pid}) {describe_exit(child.proc.returncode)}"
        delay = self.policy.delay(child.crashes, now)
        p = self.policy
        if delay is None:
            raise GaveUp(
                f"{how}: {len(child.crashes)} crashes within {p.window_s:g} s "
                f"(at most {p.max_restarts} restarts allowed)"
            )
        self.log(
            f"{how}; restarting in {delay:g} s "
            f"(crash {len(child.crashes)} of at most {p.max_restarts} within {p.window_s:g} s)"
        )
        child.restart_at = now + delay

    def watch(self, interval_s: float = 0.2) -> None:
        """Supervise until a child crashes too often (GaveUp) or the caller is
        interrupted (KeyboardInterrupt passes through)."""
        while True:
            self.tick(time.monotonic())
            time.sleep(interval_s)

    def stop(self) -> None:
        """SIGTERM every live child, then SIGKILL whichever is still up after 10 s."""
        for child in self.children:
            if child.proc and child.proc.poll() is None:
                child.proc.terminate()
        deadline = time.monotonic() + 10
        for child in self.children:
            if child.proc is None:
                continue
            try:
                child.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.proc.kill()
                child.proc.wait()
