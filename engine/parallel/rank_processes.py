"""Rank 0's handle on the other tensor-parallel ranks: spawns them, waits for them through
start-up (a rank that dies or fails is named, and the others are stopped), sends each step,
and stops and joins them.

Each step's `StepBatch` goes to every rank over its own pipe (pickled plain data; see
docs/performance.md for what that costs per step). The collectives themselves run over the
torch.distributed group the ranks join once loaded.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess

import torch
import torch.distributed as dist

from tandem.engine.core.config import EngineConfig
from tandem.engine.exec.step_batch import StepBatch
from tandem.engine.models.tensor_parallel import TensorParallel
from tandem.engine.parallel import rank_main

logger = logging.getLogger(__name__)

# How long a stopped rank may take to exit before it is killed.
_STOP_GRACE_S = 30.0


def exit_process(message: str) -> None:
    """What a node does when one of its ranks dies: the node is dead (as vLLM's engine is);
    its peers see its sockets close and fail over, and Kubernetes restarts the pod."""
    logger.critical("%s; exiting", message)
    os._exit(1)


class RankStartupError(RuntimeError):
    """A tensor-parallel rank died or failed before the group was ready. `pids`: every
    rank's process (all stopped by the time the engine's constructor raises this)."""

    def __init__(self, message: str, pids: list[int]) -> None:
        super().__init__(message)
        self.pids = pids


class RankProcesses:
    """Owns ranks 1..N-1 (processes, pipes, lifelines). Not thread-safe: one engine thread
    drives it."""

    def __init__(self, config: EngineConfig, num_threads: int) -> None:
        """Spawn the ranks; they start loading at once. `num_threads`: torch threads each."""
        self.processes: list[BaseProcess] = []
        self.conns: list[Connection] = []
        self._lifelines: list[Connection] = []
        # Per rank 1..N-1 once loaded: peak RSS, and the RSS that loading its shard added.
        self.peak_rss_bytes: list[int] = []
        self.load_rss_bytes: list[int] = []
        self._store: dist.TCPStore | None = None  # rank 0 hosts it while the group lives
        self._reports: list[tuple[int, int, str]] = []  # (rank, write id, state) unread
        self._calls = 0  # the last call id
        self._closing = threading.Event()
        self._stop_watch_r, self._stop_watch_w = mp.Pipe(duplex=False)
        try:
            self._spawn(config, num_threads)
        except BaseException:
            self.kill()  # the ranks already started
            raise

    def _spawn(self, config: EngineConfig, num_threads: int) -> None:
        ctx = mp.get_context("spawn")
        for rank in range(1, config.tensor_parallel_size):
            parent, child = ctx.Pipe()
            watch, keep = ctx.Pipe(duplex=False)
            process = ctx.Process(
                target=rank_main.run_rank,
                args=(config, rank, child, watch, num_threads),
                name=f"tandem-tp-rank{rank}",
                daemon=True,
            )
            process.start()
            child.close()
            watch.close()
            self.processes.append(process)
            self.conns.append(parent)
            self._lifelines.append(keep)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def wait_loaded(self) -> None:
        """Block until every rank has loaded its shard. Raises RankStartupError naming the
        first rank that died or failed."""
        loaded = [self._expect(i, "loaded") for i in range(len(self.conns))]
        self.peak_rss_bytes = [message[1] for message in loaded]
        self.load_rss_bytes = [message[2] for message in loaded]

    def connect(self, tp: TensorParallel, device: torch.device) -> None:
        """Host the group's store, let every rank join, join as rank 0, and wait until
        every rank is ready (its graphs captured, when configured, by the caller too)."""
        store = dist.TCPStore(
            "127.0.0.1", 0, tp.size, True, timeout=rank_main.CONNECT_TIMEOUT, wait_for_workers=False
        )
        for conn in self.conns:
            conn.send(("connect", store.port))
        tp.connect(store, device)
        self._store = store

    def wait_ready(self) -> None:
        for i in range(len(self.conns)):
            self._expect(i, "ready")

    def _expect(self, index: int, kind: str) -> tuple:
        conn, process = self.conns[index], self.processes[index]
        rank = index + 1
        ready = wait([conn, process.sentinel])
        if conn in ready:
            try:
                message = conn.recv()
            except EOFError:
                message = None
            if message is not None and message[0] == kind:
                return message
            if message is not None and message[0] == "failed":
                raise RankStartupError(
                    f"tensor-parallel rank {rank} (pid {process.pid}) failed during start-up:\n"
                    f"{message[1]}",
                    self.pids,
                )
        process.join()
        raise RankStartupError(
            f"tensor-parallel rank {rank} (pid {process.pid}) exited with code "
            f"{process.exitcode} during start-up, before it was {kind}",
            self.pids,
        )

    def watch(self, on_death: Callable[[str], None]) -> None:
        """From now on, call `on_death(why)` from a watcher thread the moment a rank exits
        unless `close` stopped it: a rank dying mid-step would otherwise leave rank 0 in a
        collective until its timeout."""

        def run() -> None:
            sentinels = {p.sentinel: (rank, p) for rank, p in enumerate(self.processes, 1)}
            ready = wait([*sentinels, self._stop_watch_r])
            if self._closing.is_set() or self._stop_watch_r in ready:
                return
            rank, process = sentinels[next(s for s in ready if s in sentinels)]
            process.join()
            on_death(
                f"tensor-parallel rank {rank} (pid {process.pid}) exited with code "
                f"{process.exitcode}"
            )

        threading.Thread(target=run, name="tp-rank-watch", daemon=True).start()

    def send(self, rank: int, message: object) -> None:
        """A command for rank `rank` (>= 1), run after every step sent before it."""
        self.conns[rank - 1].send(message)

    def call(self, rank: int, kind: str, *args: object, timeout: float | None = None) -> object:
        """Send rank `rank` the command `(kind, call id, *args)` and return its answer's
        payload, or None when none came within `timeout` seconds (a stopped rank: a later,
        stale answer is dropped). Write reports that arrive meanwhile are kept for
        `reports`. Raises RuntimeError when the rank is gone."""
        self._calls += 1
        call_id = self._calls
        self.send(rank, (kind, call_id, *args))
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            reply = self._receive(rank, left)
            if reply is None:
                return None
            if reply[0] == "xfer":
                self._reports.append((rank, reply[1], reply[2]))
            elif reply[1] == call_id:
                return reply[2]

    def _receive(self, rank: int, timeout: float | None) -> tuple | None:
        conn, process = self.conns[rank - 1], self.processes[rank - 1]
        ready = wait([conn, process.sentinel], timeout)
        if not ready:
            return None
        if conn in ready:
            with contextlib.suppress(EOFError):
                return conn.recv()
        raise self._gone(rank)

    def _gone(self, rank: int) -> RuntimeError:
        process = self.processes[rank - 1]
        process.join(_STOP_GRACE_S)
        return RuntimeError(
            f"tensor-parallel rank {rank} (pid {process.pid}) is gone (exit code "
            f"{process.exitcode})"
        )

    def reports(self) -> list[tuple[int, int, str]]:
        """(rank, write id, DONE or ERR) for every write a rank finished since the last
        call."""
        for rank, conn in enumerate(self.conns, 1):
            while conn.poll():
                try:
                    reply = conn.recv()
                except EOFError:
                    raise self._gone(rank) from None
                if reply[0] == "xfer":
                    self._reports.append((rank, reply[1], reply[2]))
        reports, self._reports = self._reports, []
        return reports

    def broadcast(self, batch: StepBatch) -> None:
        """Send one step to every rank (they run it as rank 0 does)."""
        for conn in self.conns:
            conn.send(batch)

    def close(self) -> None:
        """Stop every rank (None, then a kill after a grace period) and join it. Idempotent."""
        self._stop_watching()
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.send(None)
        for process in self.processes:
            process.join(_STOP_GRACE_S)
            if process.exitcode is None:
                process.kill()
                process.join()
        for conn in self.conns + self._lifelines:
            conn.close()
        self.conns, self._lifelines = [], []

    def kill(self) -> None:
        """Stop every rank now (start-up failed) and join it."""
        self._stop_watching()
        for process in self.processes:
            if process.exitcode is None:
                process.kill()
        for process in self.processes:
            process.join()
        for conn in self.conns + self._lifelines:
            conn.close()
        self.conns, self._lifelines = [], []

    def _stop_watching(self) -> None:
        self._closing.set()
        with contextlib.suppress(OSError):
            self._stop_watch_w.send(None)
