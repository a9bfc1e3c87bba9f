"""The block pool: exact ids, reference counts and eviction order, plus a state machine."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tandem.engine.core.block_pool import BlockPool


def ids(blocks):
    return [b.block_id for b in blocks]


def test_new_blocks_come_from_the_head_in_id_order():
    pool = BlockPool(6)
    assert ids(pool.get_new_blocks(2)) == [0, 1]
    assert ids(pool.get_new_blocks(3)) == [2, 3, 4]
    assert pool.num_free_blocks == 1
    assert [b.ref_cnt for b in pool.blocks] == [1, 1, 1, 1, 1, 0]
    pool.check_integrity()


def test_refusal_changes_nothing():
    pool = BlockPool(3)
    pool.get_new_blocks(2)
    with pytest.raises(ValueError, match="asked for 2 blocks, 1 free"):
        pool.get_new_blocks(2)
    assert pool.num_free_blocks == 1
    assert pool.check_integrity().in_use == 2


def test_freed_blocks_join_the_tail_in_the_given_order():
    pool = BlockPool(4)
    a = pool.get_new_blocks(2)  # 0, 1
    b = pool.get_new_blocks(2)  # 2, 3
    pool.free_blocks(reversed(b))  # tail first: 3 then 2
    pool.free_blocks(reversed(a))  # 1 then 0
    assert ids(pool.free_queue) == [3, 2, 1, 0]
    assert ids(pool.get_new_blocks(4)) == [3, 2, 1, 0]


def test_cached_blocks_are_evicted_in_lru_order_and_lose_their_hash():
    pool = BlockPool(4)
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(blocks, [100, 200, 300], start=0)
    pool.free_blocks(reversed(blocks))
    # Block 3 was never taken, so it is still at the head; the freed ones follow tail first.
    assert ids(pool.free_queue) == [3, 2, 1, 0]
    counts = pool.check_integrity()
    assert (counts.free, counts.cached, counts.in_use) == (1, 3, 0)
    first = pool.get_new_blocks(2)
    assert ids(first) == [3, 2]
    assert pool.get_cached_block(300) is None  # evicted with block 2
    assert pool.get_cached_block(100).block_id == 0
    assert pool.num_evictions == 1


def test_touch_revives_a_cached_block_out_of_the_free_queue():
    pool = BlockPool(3)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(blocks, [7, 8], start=0)
    pool.free_blocks(reversed(blocks))
    hit = pool.get_cached_block(7)
    pool.touch([hit])
    assert hit.ref_cnt == 1
    assert ids(pool.free_queue) == [2, 1]
    pool.touch([hit])
    assert hit.ref_cnt == 2
    pool.free_blocks([hit])
    assert hit.ref_cnt == 1
    assert pool.check_integrity().in_use == 1


def test_a_hash_already_cached_keeps_the_older_block():
    pool = BlockPool(4)
    a = pool.get_new_blocks(1)
    b = pool.get_new_blocks(1)
    pool.cache_full_blocks(a, [42], 0)
    pool.cache_full_blocks(b, [42], 0)
    assert pool.get_cached_block(42) is a[0]
    assert b[0].block_hash is None
    pool.check_integrity()


def test_double_free_is_caught():
    pool = BlockPool(2)
    blocks = pool.get_new_blocks(1)
    pool.free_blocks(blocks)
    with pytest.raises(AssertionError, match="double free"):
        pool.free_blocks(blocks)


def test_caching_disabled_publishes_nothing():
    pool = BlockPool(2, enable_caching=False)
    blocks = pool.get_new_blocks(1)
    pool.cache_full_blocks(blocks, [1], 0)
    assert pool.get_cached_block(1) is None and blocks[0].block_hash is None


class BlockPoolMachine(RuleBasedStateMachine):
    """Random allocate / cache / touch / free / evict sequences; integrity after each step."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(8)
        self.owners: list[list] = []  # each owner holds one reference on each of its blocks
        self.next_hash = 1

    @rule(n=st.integers(1, 4))
    def allocate(self, n):
        if n <= self.pool.num_free_blocks:
            self.owners.append(self.pool.get_new_blocks(n))
        else:
            with pytest.raises(ValueError):
                self.pool.get_new_blocks(n)

    @precondition(lambda self: self.owners)
    @rule(data=st.data())
    def cache(self, data):
        blocks = data.draw(st.sampled_from(self.owners))
        hashes = list(range(self.next_hash, self.next_hash + len(blocks)))
        self.next_hash += len(blocks)
        self.pool.cache_full_blocks(blocks, hashes, 0)

    @precondition(lambda self: self.owners)
    @rule(data=st.data())
    def free(self, data):
        i = data.draw(st.integers(0, len(self.owners) - 1))
        self.pool.free_blocks(reversed(self.owners.pop(i)))

    @precondition(lambda self: self.pool.cached)
    @rule(data=st.data())
    def touch_cached(self, data):
        block_hash = data.draw(st.sampled_from(sorted(self.pool.cached)))
        block = self.pool.get_cached_block(block_hash)
        self.pool.touch([block])
        self.owners.append([block])

    @invariant()
    def integrity(self):
        counts = self.pool.check_integrity()
        held = sum(len(o) for o in self.owners)
        assert sum(b.ref_cnt for b in self.pool.blocks) == held
        assert counts.free + counts.cached == self.pool.num_free_blocks


BlockPoolMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None
)
test_block_pool_state_machine = BlockPoolMachine.TestCase
