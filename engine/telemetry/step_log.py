"""The last engine steps of a node and what each cost the process: the model runner's own CPU
time, and the whole process's wall and CPU time from one step's start to the next.

The simulator's step-time model is calibrated on `ModelRunner.execute` alone
(`bench/calibrate.py`); everything else a node does per step (scheduling, detokenizing,
streaming records from the HTTP thread under the same interpreter lock, metrics, KV events)
shows up here as the cycle's CPU beyond `execute_cpu_s`. `bench/sim_validate.py` fits that
remainder against the batch size. `GET /debug/steps` serves the log.

A cycle is measured only between two steps with no wait between them (the loop stayed
busy); a step after which the loop may wait keeps `cycle_s` None. Every step measures its
tail: the engine thread's CPU from the runner's end to the loop's next wait or next step
(`tail_thread_cpu_s`, and `tail_s` on the host's clock: what the loop does for the step
after the model, such as a prefill worker posting its KV writes and publishing its KV
events; not the polls while an idle loop waits). A prefill worker waits a bounded time for
finished jobs' last writes before a step; the step's record gives that wait as
`writes_wait_s`. Between two steps with no wait between them (the first one's `cycle_s`
set) the wall from one runner's end to the next one's start is the first one's tail: the
loop's own work, that wait for last writes, and the time the engine thread waited for a
core or the interpreter lock. After a wait (the common case on a prefill worker, whose
steps take every prompt waiting), the wait for last writes comes after the tail ended.

`execute_switches` counts the times the engine thread left its core inside the model
runner (it waited for the interpreter lock, which the HTTP thread takes to stream records,
or the kernel gave the core to other work): on a host whose cores other processes share,
how long the engine runs before it yields, which the simulator's time slices take
(`sim/sliced_cores.py`).
"""

from __future__ import annotations

import resource
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tandem.engine.core.scheduler import SchedulerOutput

# Enough for a few minutes of a busy decode node (a record is ~100 bytes).
DEFAULT_CAPACITY = 16384


def attention_pairs(num_new: int, context_len: int) -> int:
    """Query-key pairs causal attention scores for `num_new` tokens ending a context of
    `context_len` tokens: the i-th new token (from 0) sees `context_len - num_new + i + 1`."""
    return num_new * context_len - num_new * (num_new - 1) // 2


def context_lens(out: SchedulerOutput) -> list[int]:
    """Each scheduled request's context after the step, from its plan (before the step's
    counters advance)."""
    return [r.num_computed_tokens + n for r, n in zip(out.scheduled, out.num_scheduled_tokens)]


@dataclass(frozen=True)
class StepWork:
    """What a step computes, summed over its batch."""

    num_seqs: int  # requests in the batch
    num_tokens: int  # tokens computed
    num_context_tokens: int  # KV entries attended to (each request's context after the step)
    num_attention_pairs: int

    @classmethod
    def of(cls, num_tokens: Sequence[int], context_lens: Sequence[int]) -> StepWork:
        """Per request its new tokens and its context after the step."""
        pairs = sum(attention_pairs(n, c) for n, c in zip(num_tokens, context_lens))
        return cls(len(num_tokens), sum(num_tokens), sum(context_lens), pairs)


@dataclass
class StepRecord:
    seq: int  # 1 for the node's first step
    num_seqs: int
    num_tokens: int
    num_context_tokens: int
    num_attention_pairs: int
    num_sampled: int  # requests that sampled a token
    start_s: float  # the host's monotonic clock when the model runner started
    execute_s: float  # wall inside the model runner
    execute_cpu_s: float  # the engine thread's CPU inside the model runner
    execute_switches: int | None  # the engine thread's context switches inside it (Linux)
    cycle_s: float | None = None  # wall, this step's start to the next one's
    cycle_cpu_s: float | None = None  # the process's CPU (all threads) over the same
    cycle_thread_cpu_s: float | None = None  # the engine thread's CPU over the same
    cycle_switches: int | None = None  # the engine thread's context switches over the same
    # the engine thread's CPU from the runner's end to the loop's next wait or next step
    tail_thread_cpu_s: float | None = None
    tail_s: float | None = None  # wall over the same
    # wall the loop spent before this step waiting for finished jobs' last KV writes (a
    # prefill worker's bounded wait; inside the previous step's tail only when no wait
    # came between the two)
    writes_wait_s: float = 0.0


@dataclass(frozen=True)
class Clocks:
    """A step's start on the clocks its record needs."""

    wall: float  # the host's monotonic clock
    cpu: float  # the process's CPU
    thread: float  # the engine thread's CPU
    switches: int | None  # the engine thread's context switches

    @classmethod
    def now(cls) -> Clocks:
        return cls(time.monotonic(), time.process_time(), time.thread_time(), thread_switches())


class StepLog:
    """A bounded log of steps; lives on the engine thread."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self._records: deque[StepRecord] = deque(maxlen=capacity)
        self._seq = 0
        self._open: tuple[StepRecord, Clocks] | None = None  # the cycle and its start
        # the last step's record and its runner's end on the engine thread's CPU clock and
        # the host's, until its tail ends
        self._tail: tuple[StepRecord, float, float] | None = None
        self._writes_wait_s = 0.0  # waited for last writes since the last step

    def begin(self) -> Clocks:
        """A step starts: close the previous cycle; returns the clocks `end` needs."""
        # the tail's thread clock read before the host's, so that its interval on the host's
        # clock holds the thread's (as `end` reads them the other way round for its start)
        tail_end = time.thread_time()
        clocks = Clocks.now()
        self._end_tail(tail_end, clocks.wall)
        if self._open is not None:
            record, start = self._open
            record.cycle_s, record.cycle_cpu_s = clocks.wall - start.wall, clocks.cpu - start.cpu
            record.cycle_thread_cpu_s = clocks.thread - start.thread
            record.cycle_switches = _delta(start.switches, clocks.switches)
        return clocks

    def end(self, clocks: Clocks, work: StepWork, num_sampled: int) -> None:
        """The step `begin` returned `clocks` for has run the model."""
        wall, thread0, switches0 = clocks.wall, clocks.thread, clocks.switches
        thread, now = time.thread_time(), time.monotonic()
        tail_start = time.thread_time()  # after `now`: see `begin`
        switches = thread_switches()
        self._seq += 1
        record = StepRecord(
            self._seq,
            work.num_seqs,
            work.num_tokens,
            work.num_context_tokens,
            work.num_attention_pairs,
            num_sampled,
            wall,
            now - wall,
            thread - thread0,
            _delta(switches0, switches),
            writes_wait_s=self._writes_wait_s,
        )
        self._writes_wait_s = 0.0
        self._records.append(record)
        self._open = (record, clocks)
        self._tail = (record, tail_start, now)

    def writes_waited(self, seconds: float) -> None:
        """The loop waited `seconds` for finished jobs' last writes before its next step."""
        self._writes_wait_s += seconds

    def wait(self) -> None:
        """The loop may wait before its next step: the open cycle is not a cycle."""
        self._open = None
        if self._tail is not None:  # the loop waits often: read the clocks only when needed
            self._end_tail(time.thread_time(), time.monotonic())

    def _end_tail(self, thread: float, wall: float) -> None:
        if self._tail is not None:
            record, end, end_wall = self._tail
            record.tail_thread_cpu_s, record.tail_s = thread - end, wall - end_wall
            self._tail = None

    @property
    def last_seq(self) -> int:
        """The last step's number (0 before the first)."""
        return self._seq

    def since(self, seq: int = 0) -> list[dict[str, object]]:
        """The records after step `seq` still in the log, oldest first."""
        return [asdict(r) for r in self._records if r.seq > seq]


def thread_switches() -> int | None:
    """The calling thread's context switches so far, voluntary and not (None where the
    system does not count them per thread)."""
    who = getattr(resource, "RUSAGE_THREAD", None)
    if who is None:
        return None
    usage = resource.getrusage(who)
    return usage.ru_nvcsw + usage.ru_nivcsw


def _delta(before: int | None, after: int | None) -> int | None:
    return None if before is None or after is None else after - before
