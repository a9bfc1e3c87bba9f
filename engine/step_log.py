"""The last engine steps of a node and what each cost the process: the model runner's own CPU
time, and the whole process's wall and CPU time from one step's start to the next.

The simulator's step-time model is calibrated on `ModelRunner.execute` alone
(`bench/calibrate.py`); everything else a node does per step (scheduling, detokenizing,
streaming records from the HTTP thread under the same interpreter lock, metrics, KV events)
shows up here as the cycle's CPU beyond `execute_cpu_s`. `bench/sim_validate.py` fits that
remainder against the batch size. `GET /debug/steps` serves the log.

A cycle is measured only between two steps with no wait between them (the loop stayed
busy); a step after which the loop may wait keeps `cycle_s` None.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tandem.engine.scheduler import SchedulerOutput

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
    cycle_s: float | None = None  # wall, this step's start to the next one's
    cycle_cpu_s: float | None = None  # the process's CPU (all threads) over the same


class StepLog:
    """A bounded log of steps; lives on the engine thread."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self._records: deque[StepRecord] = deque(maxlen=capacity)
        self._seq = 0
        self._open: tuple[StepRecord, float, float] | None = None  # (record, wall, cpu)

    def begin(self) -> tuple[float, float, float]:
        """A step starts: close the previous cycle; returns the clocks `end` needs."""
        wall, cpu = time.monotonic(), time.process_time()
        if self._open is not None:
            record, wall0, cpu0 = self._open
            record.cycle_s, record.cycle_cpu_s = wall - wall0, cpu - cpu0
        return wall, cpu, time.thread_time()

    def end(self, clocks: tuple[float, float, float], work: StepWork, num_sampled: int) -> None:
        """The step `begin` returned `clocks` for has run the model."""
        wall, cpu, thread0 = clocks
        thread, now = time.thread_time(), time.monotonic()
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
        )
        self._records.append(record)
        self._open = (record, wall, cpu)

    def wait(self) -> None:
        """The loop may wait before its next step: the open cycle is not a cycle."""
        self._open = None

    @property
    def last_seq(self) -> int:
        """The last step's number (0 before the first)."""
        return self._seq

    def since(self, seq: int = 0) -> list[dict[str, object]]:
        """The records after step `seq` still in the log, oldest first."""
        return [asdict(r) for r in self._records if r.seq > seq]
