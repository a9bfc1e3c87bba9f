"""Prefix-cache stats are counted once per request, when the scheduler admits it: not on
every lookup, not again while it waits for blocks, not after preemption or a failed remote
prefill (vLLM counts the same way: queried prompt tokens and the tokens found cached)."""

from __future__ import annotations

from tandem.engine.core.request import Request
from tandem.engine.core.sampling_params import SamplingParams
from tests.engine.test_scheduler import fake_run, make_scheduler, run_to_end


def prompt_request(rid: str, prompt: list[int], max_tokens: int = 4) -> Request:
    return Request(rid, list(prompt), SamplingParams(max_tokens=max_tokens, ignore_eos=True))


def stats(scheduler) -> tuple[int, int]:
    return scheduler.kv.stats.queries, scheduler.kv.stats.hits


def test_two_requests_sharing_a_prompt_count_each_token_once():
    s = make_scheduler(tokens=256, blocks=64, block_size=16)
    shared = list(range(64))  # four full blocks; a hit leaves the last token to compute
    s.add_request(prompt_request("a", shared))
    s.add_request(prompt_request("b", shared))
    run_to_end(s)
    assert stats(s) == (128, 48)


def test_a_request_that_waits_for_blocks_is_counted_when_admitted():
    s = make_scheduler(tokens=64, blocks=4, block_size=4)
    s.add_request(prompt_request("big", list(range(13)), max_tokens=3))  # the whole pool
    s.add_request(prompt_request("next", [*range(8), 99], max_tokens=2))
    waited = 0
    while s.has_unfinished_requests():
        out = s.schedule()
        waited += any(r.request_id == "next" for r in s.waiting)
        s.update_from_output(out, fake_run(out))
    assert waited >= 2, "the test needs `next` to be looked up on several steps"
    # `big` published blocks 0-2 (12 tokens); `next` finds its first 8 tokens there.
    assert stats(s) == (13 + 9, 8)


def test_preemption_and_recompute_do_not_count_again():
    s = make_scheduler(blocks=9, block_size=4)  # 36 slots for three 20-token sequences
    for i in range(3):
        s.add_request(prompt_request(f"r{i}", [100 * i + t for t in range(8)], max_tokens=12))
    run_to_end(s)
    assert s.num_preemptions > 0
    assert stats(s) == (3 * 8, 0)


def test_a_retried_remote_prefill_is_counted_once():
    s = make_scheduler(blocks=16, block_size=4)
    r = prompt_request("a", list(range(9)))
    r.prefill_worker = "tcp://p1"
    s.add_request(r)
    assert s.schedule().remote_prefills == [r]
    s.retry_remote("a", "tcp://p2")
    assert s.schedule().remote_prefills == [r]
    s.retry_remote("a", None)  # then locally
    run_to_end(s)
    assert stats(s) == (9, 0)
