"""The scheduler, isolated from the model: a test-only runner samples a token that depends
only on the sequence so far, so any correct schedule yields the same tokens."""

from __future__ import annotations

import zlib

import pytest

from tandem.engine.core.config import SchedulerConfig
from tandem.engine.core.kv_cache_manager import KVCacheManager
from tandem.engine.core.request import Request, RequestStatus
from tandem.engine.core.sampling_params import SamplingParams
from tandem.engine.core.scheduler import ModelRunnerOutput, Scheduler, SchedulerOutput

VOCAB = 1000


def fake_token(token_ids: list[int]) -> int:
    """What the fake model samples after `token_ids`."""
    return zlib.crc32(",".join(map(str, token_ids)).encode()) % VOCAB


def fake_run(out: SchedulerOutput) -> ModelRunnerOutput:
    tokens = []
    for request, n in zip(out.scheduled, out.num_scheduled_tokens):
        done = request.num_computed_tokens + n == request.num_tokens
        tokens.append(fake_token(request.all_token_ids) if done else None)
    return ModelRunnerOutput(tokens, [None] * len(tokens))


def make_scheduler(tokens=64, seqs=8, blocks=64, block_size=4, max_len=256) -> Scheduler:
    kv = KVCacheManager(block_size=block_size, num_blocks=blocks)
    return Scheduler(SchedulerConfig(tokens, seqs, max_len), kv)


def request(rid: str, prompt_len: int, max_tokens: int = 8) -> Request:
    # crc32, not hash(): str hashes change with every process (PYTHONHASHSEED)
    offset = zlib.crc32(rid.encode())
    prompt = [(offset + i) % VOCAB for i in range(prompt_len)]
    return Request(rid, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))


def run_to_end(scheduler: Scheduler, check=None) -> dict[str, list[int]]:
    results = {}
    while scheduler.has_unfinished_requests():
        out = scheduler.schedule()
        if check:
            check(scheduler, out)
        for r in scheduler.update_from_output(out, fake_run(out)):
            results[r.request_id] = r.output_token_ids
        scheduler.kv.check_integrity()
    return results


def test_budgets_are_honoured_and_prefill_is_chunked():
    s = make_scheduler(tokens=16, seqs=3)
    for i, n in enumerate([40, 5, 9, 30, 2]):
        s.add_request(request(f"r{i}", n))
    seen_chunks = []

    def check(sched, out):
        assert out.total_num_scheduled_tokens <= 16
        assert len(out.scheduled) <= 3 and len(sched.running) <= 3
        seen_chunks.extend(
            n for r, n in zip(out.scheduled, out.num_scheduled_tokens) if r.request_id == "r0"
        )

    results = run_to_end(s, check)
    assert sorted(results) == ["r0", "r1", "r2", "r3", "r4"]
    assert seen_chunks[:3] == [16, 16, 8]  # 40-token prompt in three chunks
    assert s.kv.check_integrity().in_use == 0


def test_running_requests_are_scheduled_before_waiting_ones():
    s = make_scheduler(tokens=10, seqs=4)
    s.add_request(request("a", 3))
    s.update_from_output(first := s.schedule(), fake_run(first))
    s.add_request(request("b", 30))
    out = s.schedule()
    assert [r.request_id for r in out.scheduled] == ["a", "b"]
    assert out.num_scheduled_tokens == [1, 9]  # a's decode token first, b gets the rest


def test_preemption_takes_the_newest_and_the_result_is_unchanged():
    reference = make_scheduler(blocks=64)
    constrained = make_scheduler(blocks=9)  # 36 token slots for three 20-token sequences
    for s in (reference, constrained):
        for i in range(3):
            s.add_request(request(f"r{i}", 8, max_tokens=12))
    preempted = []
    results = run_to_end(
        constrained, lambda s, out: preempted.extend(r.request_id for r in out.preempted)
    )
    assert preempted and preempted[0] == "r2"
    assert constrained.num_preemptions == len(preempted)
    assert results == run_to_end(reference)


@pytest.mark.parametrize("steps_before_abort", [0, 1, 2, 5])
def test_abort_at_any_point_frees_everything(steps_before_abort):
    s = make_scheduler(tokens=8, seqs=2)
    for i in range(3):
        s.add_request(request(f"r{i}", 12, max_tokens=20))
    for _ in range(steps_before_abort):
        out = s.schedule()
        s.update_from_output(out, fake_run(out))
    aborted = s.finish_requests(["r0", "r1", "r2", "missing"], RequestStatus.FINISHED_ABORTED)
    assert {r.request_id for r in aborted} == {"r0", "r1", "r2"}
    assert all(r.status.finish_reason == "abort" for r in aborted)
    assert not s.has_unfinished_requests() and not s.running and not s.waiting
    counts = s.kv.check_integrity()
    assert counts.in_use == 0


def test_a_request_waits_when_the_pool_is_full_and_runs_later():
    s = make_scheduler(blocks=4, seqs=4)
    s.add_request(request("big", 13, max_tokens=3))  # 16 tokens: the whole pool
    s.add_request(request("next", 4, max_tokens=2))
    out = s.schedule()
    assert [r.request_id for r in out.scheduled] == ["big"]
    assert [r.request_id for r in s.waiting] == ["next"]
    order = []
    while s.has_unfinished_requests():
        out = s.schedule()
        order += [r.request_id for r in s.update_from_output(out, fake_run(out))]
    assert order == ["big", "next"]
    assert s.num_preemptions == 0
    assert s.kv.check_integrity().in_use == 0


def test_duplicate_request_ids_are_refused():
    s = make_scheduler()
    s.add_request(request("a", 3))
    with pytest.raises(ValueError, match="already in use"):
        s.add_request(request("a", 3))
