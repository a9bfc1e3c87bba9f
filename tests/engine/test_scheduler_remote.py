"""The scheduler's remote-prefill path, isolated from the model and the network."""

from __future__ import annotations

from tandem.engine.core.request import RequestStatus
from tests.engine.test_scheduler import fake_run, make_scheduler, request


def remote_request(rid: str, prompt_len: int, worker: str = "tcp://p1", **kw):
    r = request(rid, prompt_len, **kw)
    r.prefill_worker = worker
    return r


def test_remote_admission_reserves_prompt_plus_one_and_publishes_nothing():
    s = make_scheduler(blocks=16, block_size=4)
    r = remote_request("a", 8)  # 8 prompt tokens + 1 decode step = 3 blocks
    s.add_request(r)
    out = s.schedule()
    assert out.remote_prefills == [r] and out.is_empty
    assert r.status == RequestStatus.WAITING_FOR_REMOTE_KV
    assert len(s.kv.block_ids("a")) == 3
    assert s.remote_destination(r) == s.kv.block_ids("a")[:2]
    assert not s.kv.pool.cached, "blocks must not be published before their KV lands"
    s.kv.check_integrity()


def test_completion_publishes_blocks_and_joins_the_decode_batch():
    s = make_scheduler(blocks=16, block_size=4)
    r = remote_request("a", 8, max_tokens=3)
    s.add_request(r)
    s.schedule()
    assert s.complete_remote_prefill("a", 42, None) is None
    assert r.status == RequestStatus.RUNNING and r.output_token_ids == [42]
    assert r.num_computed_tokens == 8 and len(s.kv.pool.cached) == 2
    out = s.schedule()
    assert out.scheduled == [r] and out.num_scheduled_tokens == [1]
    # A second request with the same prompt now hits both blocks and skips them remotely.
    twin = remote_request("b", 9)
    twin.all_token_ids[:8] = r.prompt_token_ids
    twin.prompt_token_ids[:8] = r.prompt_token_ids
    s.add_request(twin)
    s.update_from_output(out, fake_run(out))
    out = s.schedule()
    assert twin in out.remote_prefills and twin.num_remote_skip_blocks == 2
    assert s.remote_destination(twin) == s.kv.block_ids("b")[2:3]
    s.kv.check_integrity()


def test_first_token_can_finish_the_request():
    s = make_scheduler()
    r = remote_request("a", 5, max_tokens=1)
    s.add_request(r)
    s.schedule()
    assert s.complete_remote_prefill("a", 1, None) is r
    assert r.status == RequestStatus.FINISHED_LENGTH and not s.requests
    assert s.kv.check_integrity().in_use == 0


def test_a_request_that_does_not_fit_waits_and_is_not_sent():
    s = make_scheduler(blocks=4, block_size=4)
    big, small = remote_request("big", 12), remote_request("small", 12)
    s.add_request(big)
    s.add_request(small)
    out = s.schedule()
    assert out.remote_prefills == [big]  # 4 blocks: all of the pool
    assert list(s.waiting) == [small]
    s.complete_remote_prefill("big", 1, None)
    s.finish_requests(["big"], RequestStatus.FINISHED_ABORTED)
    assert s.schedule().remote_prefills == [small]


def test_abort_while_waiting_holds_destination_blocks_until_released():
    s = make_scheduler(blocks=8, block_size=4)
    r = remote_request("a", 8)
    s.add_request(r)
    s.schedule()
    dst = s.remote_destination(r)
    s.finish_requests(["a"], RequestStatus.FINISHED_ABORTED)
    [hold] = s.abandoned_remote
    assert (hold.request_id, hold.attempt, hold.worker) == ("a", 1, "tcp://p1")
    counts = s.kv.check_integrity()
    assert counts.in_use == 3 and s.kv.is_held(hold.key)
    assert all(s.kv.pool.blocks[b].ref_cnt == 1 for b in dst)
    # Nothing else can take the held blocks.
    other = request("b", 16)
    s.add_request(other)
    s.schedule()
    assert not set(dst) & set(s.kv.block_ids("b"))
    assert s.kv.release(hold.key) and not s.kv.release(hold.key)
    s.kv.check_integrity()


def test_retry_moves_to_the_next_worker_then_local():
    s = make_scheduler(blocks=16, block_size=4)
    r = remote_request("a", 8, max_tokens=2)
    s.add_request(r)
    s.schedule()
    s.retry_remote("a", "tcp://p2")
    assert s.abandoned_remote[-1].worker == "tcp://p1"
    out = s.schedule()
    assert out.remote_prefills == [r] and r.num_remote_attempts == 2
    s.retry_remote("a", None)
    out = s.schedule()
    assert out.scheduled == [r] and out.num_scheduled_tokens == [8] and not out.remote_prefills
    assert s.kv.num_held_blocks == 6
    for hold in s.abandoned_remote:
        s.kv.release(hold.key)
    s.kv.check_integrity()


def test_threshold_keeps_short_prompts_local():
    s = make_scheduler()
    s.remote_prefill_threshold = 10
    short, long = remote_request("s", 6), remote_request("l", 12)
    s.add_request(short)
    s.add_request(long)
    out = s.schedule()
    assert out.num_local_decisions == 1 and out.remote_prefills == [long]
    assert out.scheduled == [short] and short.prefill_worker is None


def test_every_first_admission_is_a_decision_and_a_retry_is_not():
    """A request naming no prefill worker (the router had none) is a local decision; one
    waiting for blocks is counted when admitted, once; a remote prefill that failed over
    to here is a fallback, not a decision."""
    s = make_scheduler(blocks=4, block_size=4)
    s.add_request(request("big", 13, max_tokens=3))  # the whole pool
    s.add_request(request("next", 6, max_tokens=2))
    counted = []
    while s.has_unfinished_requests():
        out = s.schedule()
        counted.append(out.num_local_decisions)
        s.update_from_output(out, fake_run(out))
    assert counted[0] == 1 and sum(counted) == 2  # "next" waited, then counted once
    r = remote_request("r", 9)
    s.add_request(r)
    assert s.schedule().remote_prefills == [r]
    s.retry_remote("r", None)
    assert s.schedule().num_local_decisions == 0
