"""The main of tensor-parallel ranks 1..N-1, each in a process spawned by rank 0.

A rank loads its shard, reports, joins the group, then runs every `StepBatch` rank 0 sends
until it sends None. It dies with rank 0: its lifeline pipe reads end-of-file the moment
rank 0's process is gone, however that happens, even while this rank waits in a
collective that would otherwise never return.

Pipe protocol, rank 0 -> rank: ("connect", port), then one StepBatch per step, then None.
Rank -> rank 0: ("loaded", peak RSS bytes, RSS added by loading) or ("failed",
traceback), then ("ready",). Between steps, the KV transfer's commands (`RankCommands`):
("agent", call id, name) -> ("agent", call id, AgentInfo); ("write", id, parts, src ids,
dst ids), answered later by ("xfer", id, DONE or ERR); ("expect", bool): writes may land
in this rank, keep its agent progressing; ("repack", block ids, cuts); ("census", call id)
-> ("census", call id, writes in flight).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import resource
import signal
import threading
import traceback
from collections.abc import Iterator
from datetime import timedelta
from multiprocessing.connection import Connection

import torch
import torch.distributed as dist

from tandem.engine.core.config import EngineConfig
from tandem.engine.exec.model_shard import ModelShard
from tandem.engine.exec.step_batch import StepBatch
from tandem.engine.models.tensor_parallel import TensorParallel
from tandem.engine.transfer.kv_staging import rank_staging_cuts
from tandem.engine.transfer.nixl_agent import KVTransferAgent
from tandem.engine.transfer.rank_kv import RankKV

logger = logging.getLogger(__name__)

# How long joining the group may wait for the other ranks (they are loaded by then).
CONNECT_TIMEOUT = timedelta(minutes=5)

# How often a rank's agent makes progress while no command arrives: while writes are in
# flight (its own, or into it: rank 0 says so while requests wait for KV or holds, quarantined
# ones included, wait for their writer), and, rarely, otherwise.
_WRITE_POLL_S = 0.0005
_IDLE_POLL_S = 0.1


def peak_rss_bytes() -> int:
    """This process's peak resident memory (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def rss_bytes() -> int:
    """This process's resident memory now (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def rank_config(config: EngineConfig, rank: int) -> EngineConfig:
    """Rank `rank`'s config: its own GPU, `rank` after rank 0's; the CPU is shared."""
    if config.device.type != "cuda":
        return config
    first = config.device.index or 0
    return dataclasses.replace(config, device=torch.device("cuda", first + rank))


def connect_rank(tp: TensorParallel, port: int, device: torch.device) -> None:
    """Join the group through rank 0's TCP store on loopback."""
    store = dist.TCPStore("127.0.0.1", port, tp.size, False, timeout=CONNECT_TIMEOUT)
    tp.connect(store, device)


def _follow_parent(lifeline: Connection) -> None:
    """Exit at once when rank 0's process is gone (its end of the lifeline closes)."""

    def watch() -> None:
        with contextlib.suppress(EOFError, OSError):
            lifeline.recv()
        os._exit(1)

    threading.Thread(target=watch, name="tp-lifeline", daemon=True).start()


@contextlib.contextmanager
def _reported(conn: Connection) -> Iterator[None]:
    """A start-up phase whose failure rank 0 hears about (its traceback), then exit 1."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(OSError):
            conn.send(("failed", traceback.format_exc()))
        raise SystemExit(1) from None


class RankCommands:
    """A rank's side of the KV transfer (see the module's pipe protocol)."""

    def __init__(self, shard: ModelShard, conn: Connection) -> None:
        self.shard = shard
        self.conn = conn
        self.kv: RankKV | None = None
        self.expecting = False  # rank 0 waits for KV that lands in us too

    @property
    def polling(self) -> bool:
        """Our agent must make progress: our writes are in flight, or writes into our
        cache may be (UCX needs the target's worker to progress on some transports)."""
        return self.kv is not None and (self.expecting or self.kv.num_in_flight > 0)

    @property
    def poll_interval(self) -> float | None:
        """How long to wait for a command before the agent makes progress (None: no
        agent, wait as long as it takes)."""
        if self.kv is None:
            return None
        return _WRITE_POLL_S if self.polling else _IDLE_POLL_S

    def progress(self) -> None:
        """Report the writes that ended and let the agent's worker progress."""
        if self.kv is not None:
            self.report()
            self.kv.agent.progress()

    def run(self, message: tuple) -> None:
        kind, *args = message
        if kind == "agent":
            call_id, name = args
            shape, model = self.shard.tp.shape, self.shard.config.model
            agent = KVTransferAgent(
                name, self.shard.kv_cache, shape.kv_head_start, model.num_kv_heads
            )
            cuts = rank_staging_cuts(self.shard.config, self.shard.tp.rank)
            self.kv = RankKV(agent, self.shard.kv_cache, cuts)
            self.conn.send(("agent", call_id, agent.info()))
        elif kind == "write":
            write_id = args[0]
            try:
                state = self.kv.write(*args)
            except Exception:  # NIXL refused: rank 0 ends the job, as for its own writes
                logger.warning("rank %d: write %d refused", self.shard.tp.rank, write_id,
                               exc_info=True)  # fmt: skip
                state = "ERR"
            if state != "PROC":
                self.conn.send(("xfer", write_id, state))
        elif kind == "expect":
            self.expecting = args[0]
        elif kind == "repack":
            self.kv.repack(*args)
        elif kind == "census":
            self.conn.send(("census", args[0], self.kv.num_in_flight if self.kv else 0))
        else:
            raise ValueError(f"unknown command {kind!r}")

    def report(self) -> None:
        if self.kv is not None:
            for write_id, state in self.kv.poll():
                self.conn.send(("xfer", write_id, state))


def run_rank(
    config: EngineConfig, rank: int, conn: Connection, lifeline: Connection, num_threads: int
) -> None:
    """Serve as rank `rank` until rank 0 sends None or goes away."""
    # Ctrl-C reaches the whole process group: rank 0 decides when ranks stop (None, or
    # its lifeline), so a rank must not die under a step that rank 0 still drains.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _follow_parent(lifeline)
    rss_before = rss_bytes()
    torch.set_num_threads(num_threads)
    config = rank_config(config, rank)
    if config.device.type == "cuda":
        torch.cuda.set_device(config.device)
    tp = TensorParallel(config.model, rank, config.tensor_parallel_size)
    with _reported(conn):
        shard = ModelShard(config, tp)
    conn.send(("loaded", peak_rss_bytes(), rss_bytes() - rss_before))
    _, port = conn.recv()
    with _reported(conn):
        connect_rank(tp, port, config.device)
        shard.capture_graphs()
    conn.send(("ready",))
    commands = RankCommands(shard, conn)
    with contextlib.suppress(EOFError):
        while True:
            if not conn.poll(commands.poll_interval):
                commands.progress()
                continue
            message = conn.recv()
            if message is None:
                break
            if isinstance(message, StepBatch):
                shard.forward(message)
            else:
                commands.run(message)
            if commands.polling:  # between steps too: a busy node leaves no idle gaps
                commands.progress()
    # Straight out: tearing the group down at interpreter exit may abort in gloo's threads.
    conn.close()
    os._exit(0)
