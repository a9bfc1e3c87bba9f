"""KV-cache manager: prefix hits, all-or-nothing allocation, release order."""

from __future__ import annotations

import subprocess
import sys

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tandem.engine.core.block_hash import hash_block, hash_blocks
from tandem.engine.core.kv_cache_manager import KVCacheManager
from tandem.engine.core.request import Request
from tandem.engine.core.sampling_params import SamplingParams


def make_request(rid: str, tokens: list[int], salt: str | None = None) -> Request:
    return Request(rid, tokens, SamplingParams(), cache_salt=salt)


def admit(kv: KVCacheManager, request: Request) -> list[int]:
    computed = kv.get_computed_blocks(request)
    num_new = request.num_tokens - computed.num_tokens
    assert kv.allocate_slots(request, num_new, computed) is not None
    request.num_computed_tokens = request.num_tokens
    return kv.block_ids(request.request_id)


def test_hashes_chain_and_are_stable_across_processes():
    tokens = list(range(40))
    hashes = hash_blocks(tokens, 16)
    assert len(hashes) == 2  # only full blocks
    assert hashes[1] == hash_block(hashes[0], tokens[16:32])
    assert hash_blocks(tokens, 16, ("rev-b",))[0] != hashes[0]
    code = (
        "from tandem.engine.core.block_hash import hash_blocks; print(hash_blocks(range(40), 16))"
    )
    other = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "123"},
    )
    assert other.stdout.strip() == str(hashes)


def test_shared_prompt_hits_the_prefix_cache():
    kv = KVCacheManager(block_size=4, num_blocks=16)
    a = make_request("a", list(range(10)))  # 2 full blocks + 2 tokens
    assert admit(kv, a) == [0, 1, 2]
    b = make_request("b", [*range(8), 99, 98, 97])
    computed = kv.get_computed_blocks(b)
    assert [blk.block_id for blk in computed.blocks] == [0, 1]
    assert computed.num_tokens == 8
    assert admit(kv, b) == [0, 1, 3]
    assert [kv.pool.blocks[i].ref_cnt for i in (0, 1, 2, 3)] == [2, 2, 1, 1]
    kv.check_integrity()


def test_a_full_hit_leaves_one_token_to_compute():
    kv = KVCacheManager(block_size=4, num_blocks=8)
    admit(kv, make_request("a", list(range(8))))
    again = make_request("b", list(range(8)))
    computed = kv.get_computed_blocks(again)
    assert computed.num_tokens == 4  # the last block is recomputed for its logits


def test_cache_salt_separates_tenants():
    kv = KVCacheManager(block_size=4, num_blocks=8)
    admit(kv, make_request("a", list(range(8)), salt="tenant-1"))
    assert (
        kv.get_computed_blocks(make_request("b", list(range(9)), salt="tenant-2")).num_tokens == 0
    )
    assert (
        kv.get_computed_blocks(make_request("c", list(range(9)), salt="tenant-1")).num_tokens == 8
    )


def test_allocation_refused_without_side_effect():
    kv = KVCacheManager(block_size=4, num_blocks=4)
    admit(kv, make_request("a", list(range(12))))  # 3 blocks
    big = make_request("b", list(range(100, 108)))
    before = kv.check_integrity()
    assert kv.allocate_slots(big, 8) is None
    assert kv.check_integrity() == before
    assert kv.block_ids("b") == []


def test_free_releases_tail_first_and_keeps_hashes():
    kv = KVCacheManager(block_size=4, num_blocks=4)
    a = make_request("a", list(range(12)))
    admit(kv, a)
    kv.free(a)
    counts = kv.check_integrity()
    assert (counts.cached, counts.in_use) == (3, 0)
    assert [b.block_id for b in kv.pool.free_queue] == [3, 2, 1, 0]
    # A new request evicts the never-used block first, then a's tail, keeping its prefix.
    c = make_request("c", list(range(50, 58)))
    admit(kv, c)
    assert kv.block_ids("c") == [3, 2]
    assert kv.get_computed_blocks(make_request("d", list(range(9)))).num_tokens == 8


def test_decode_growth_allocates_a_block_per_block_size_tokens():
    kv = KVCacheManager(block_size=4, num_blocks=8)
    r = make_request("a", [1, 2, 3])
    admit(kv, r)
    assert kv.block_ids("a") == [0]
    for token in (4, 5):
        r.append_output_token(token)
        assert kv.allocate_slots(r, 1) is not None
        r.num_computed_tokens += 1
    assert kv.block_ids("a") == [0, 1]
    # the first block is now full and published
    assert kv.pool.blocks[0].block_hash == hash_blocks([1, 2, 3, 4], 4)[0]
    kv.check_integrity()


class KVCacheManagerMachine(RuleBasedStateMachine):
    """Admit (with prefix hits), append decode tokens, free and evict at random; the
    manager's integrity and each request's block count are checked after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.kv = KVCacheManager(block_size=4, num_blocks=12)
        self.live: dict[str, Request] = {}
        self.count = 0

    @rule(prefix=st.integers(0, 2), length=st.integers(1, 14))
    def admit(self, prefix, length):
        # a few shared prefixes make prefix hits frequent
        tokens = [prefix] * 8 + [100 + self.count + i for i in range(length)]
        request = make_request(f"r{self.count}", tokens)
        self.count += 1
        computed = self.kv.get_computed_blocks(request)
        num_new = request.num_tokens - computed.num_tokens
        free_before = self.kv.pool.num_free_blocks
        if self.kv.allocate_slots(request, num_new, computed) is None:
            assert self.kv.pool.num_free_blocks == free_before
            assert self.kv.block_ids(request.request_id) == []
            return
        request.num_computed_tokens = request.num_tokens
        self.live[request.request_id] = request

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def append(self, data):
        request = self.live[data.draw(st.sampled_from(sorted(self.live)))]
        request.append_output_token(7)
        if self.kv.allocate_slots(request, 1) is None:
            self.kv.free(request)
            del self.live[request.request_id]  # what the scheduler's preemption does
        else:
            request.num_computed_tokens += 1

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data):
        self.kv.free(self.live.pop(data.draw(st.sampled_from(sorted(self.live)))))

    @invariant()
    def consistent(self):
        self.kv.check_integrity()
        for request in self.live.values():
            needed = self.kv.num_blocks_needed(request.num_computed_tokens)
            assert len(self.kv.block_ids(request.request_id)) == needed


KVCacheManagerMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None
)
test_kv_cache_manager_state_machine = KVCacheManagerMachine.TestCase
