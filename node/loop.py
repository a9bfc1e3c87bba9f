"""The thread a node's engine runs on, and how other threads reach it.

Engine state is touched by one thread only. HTTP handlers (on the event loop) hand it work
with `call`, which queues a function and wakes the thread through a socket pair that its
ZMQ poller watches; the function's result comes back as a future.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import queue
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

logger = logging.getLogger(__name__)


class NodeLoop:
    """A call queue plus a wake-up file descriptor for the engine thread."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], Future]] = queue.SimpleQueue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.stopping = threading.Event()

    @property
    def wake_fd(self) -> int:
        return self._wake_r.fileno()

    def call(self, fn: Callable[[], Any]) -> Future:
        """Run `fn` on the engine thread between steps, in a copy of the caller's context
        (its request id, say); its result or exception comes back in the future."""
        future: Future = Future()
        context = contextvars.copy_context()
        self._calls.put((lambda: context.run(fn), future))
        self.wake()
        return future

    def wake(self) -> None:
        # BlockingIOError: a wake-up is already pending; OSError: we are shutting down.
        with contextlib.suppress(BlockingIOError, OSError):
            self._wake_w.send(b"\0")

    def run_calls(self) -> None:
        """On the engine thread: drain the wake-ups and run every queued call."""
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass
        while True:
            try:
                fn, future = self._calls.get_nowait()
            except queue.Empty:
                return
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the caller, not lost
                future.set_exception(exc)

    def stop(self) -> None:
        self.stopping.set()
        self.wake()

    def close(self) -> None:
        self._wake_r.close()
        self._wake_w.close()
