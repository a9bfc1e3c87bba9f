"""The step log: which steps form a measured cycle, what it keeps, and its bound."""

from __future__ import annotations

import time

import pytest

from tandem.engine.telemetry.step_log import StepLog, StepWork, attention_pairs


def run_step(log: StepLog, num_seqs: int, spin: int = 0, sleeps: int = 0) -> None:
    clocks = log.begin()
    sum(range(spin))  # some CPU inside the "model"
    for _ in range(sleeps):  # the thread leaves its core, as for the interpreter lock
        time.sleep(0.001)
    work = StepWork.of([2] * num_seqs, [10] * num_seqs)
    log.end(clocks, work, num_sampled=num_seqs)


def test_back_to_back_steps_form_cycles_and_a_wait_breaks_one():
    log = StepLog()
    run_step(log, 1, spin=200_000)
    run_step(log, 2)
    log.wait()
    run_step(log, 3)
    run_step(log, 4)
    records = log.since()
    assert [r["seq"] for r in records] == [1, 2, 3, 4]
    assert [(r["num_seqs"], r["num_tokens"], r["num_sampled"]) for r in records] == [
        (1, 2, 1), (2, 4, 2), (3, 6, 3), (4, 8, 4),
    ]  # fmt: skip
    # step 1's cycle ran into step 2 without a wait; step 2 was followed by one; step 4's
    # cycle has not ended
    assert [r["cycle_s"] is not None for r in records] == [True, False, True, False]
    first = records[0]
    assert first["execute_cpu_s"] > 0
    # the cycle holds the step's own CPU (the process clock counts the thread's too)
    assert first["cycle_cpu_s"] >= first["execute_cpu_s"] * 0.5
    assert first["cycle_s"] > 0
    # a timeline on the host's clock: each step starts after the previous one's runner
    # returned, and its cycle ends where the next step starts
    assert first["execute_s"] > 0
    assert records[1]["start_s"] >= first["start_s"] + first["execute_s"]
    assert records[1]["start_s"] - first["start_s"] == first["cycle_s"]


def spin_cpu() -> float:
    """Some CPU on this thread; how much."""
    start = time.thread_time()
    sum(range(2_000_000))
    return time.thread_time() - start


def test_a_step_s_tail_is_the_loop_s_cpu_after_the_runner_until_it_waits_or_steps():
    log = StepLog()
    run_step(log, 1)
    work = spin_cpu()  # the loop's work for the step (posting writes, events)
    log.wait()
    polls = spin_cpu()  # polls while it waits: not the step's
    log.wait()
    run_step(log, 1)
    run_step(log, 1)  # straight after: a tail with next to nothing in it
    first, second, third = log.since()
    assert work <= first["tail_thread_cpu_s"] < work + polls / 2
    assert 0 <= second["tail_thread_cpu_s"] < work / 10
    assert third["tail_thread_cpu_s"] is None  # nothing has followed it yet
    # on the host's clock too: the thread's CPU is part of its wall
    assert first["tail_s"] >= first["tail_thread_cpu_s"]
    assert second["start_s"] - first["start_s"] - first["execute_s"] >= first["tail_s"]
    gap = third["start_s"] - second["start_s"] - second["execute_s"]
    assert gap == pytest.approx(second["tail_s"], abs=1e-9)  # float rounding of the clock
    assert third["tail_s"] is None


def test_a_wait_for_last_writes_is_kept_on_the_step_after_it():
    log = StepLog()
    run_step(log, 1)
    log.writes_waited(0.002)
    log.writes_waited(0.001)  # two waits before one step add up
    run_step(log, 1)
    run_step(log, 1)
    assert [r["writes_wait_s"] for r in log.since()] == [0.0, 0.003, 0.0]


def test_since_returns_only_later_steps_and_the_log_is_bounded():
    log = StepLog(capacity=3)
    assert log.last_seq == 0
    for n in range(1, 6):
        run_step(log, n)
    assert log.last_seq == 5
    assert [r["seq"] for r in log.since()] == [3, 4, 5]
    assert [r["seq"] for r in log.since(4)] == [5]
    assert log.since(5) == []


def test_attention_pairs_count_causal_query_key_pairs():
    def brute(num_new: int, context_len: int) -> int:
        start = context_len - num_new
        return sum(start + i + 1 for i in range(num_new))

    for num_new, context_len in ((1, 1), (1, 40), (7, 7), (5, 12), (16, 300)):
        assert attention_pairs(num_new, context_len) == brute(num_new, context_len)
    work = StepWork.of([3, 1], [3, 9])
    assert work == StepWork(2, 4, 12, 6 + 9)


def test_a_step_counts_the_times_its_thread_left_the_core():
    log = StepLog()
    run_step(log, 1, sleeps=3)
    (record,) = log.since()
    # each sleep is a switch; the kernel may add preemptions on a busy host, never fewer
    assert record["execute_switches"] >= 3
    assert record["cycle_switches"] is None  # its cycle has not ended
    time.sleep(0.001)  # the loop's work after the step: one more switch
    run_step(log, 1)
    first = log.since()[0]
    assert first["cycle_switches"] >= first["execute_switches"] + 1
    # the engine thread's CPU over the cycle holds the runner's
    assert first["cycle_thread_cpu_s"] >= first["execute_cpu_s"]
