"""The prefix index under in-order, missed, reordered and restarted KV-event streams."""

from __future__ import annotations

from tandem.engine.api.kv_events import KVEventBatch, Load
from tandem.router.kv_index import PrefixIndex

LOAD = Load(0, 0, 10, 10)
URL = "http://n1"


def batch(seq: int, stored=(), removed=(), node: str = "agent-a") -> KVEventBatch:
    return KVEventBatch(seq, node, list(stored), list(removed), LOAD)


def synced(hashes=(), seq: int = 0, node: str = "agent-a") -> PrefixIndex:
    index = PrefixIndex()
    assert index.apply(URL, batch(seq, node=node))  # first contact: resync
    index.load_snapshot(URL, node, seq, list(hashes))
    return index


def test_first_batch_from_a_node_asks_for_a_snapshot_and_replays_newer_batches():
    index = PrefixIndex()
    assert index.apply(URL, batch(5, stored=[3]))
    assert index.apply(URL, batch(6, stored=[4])) is False  # buffered while resyncing
    index.load_snapshot(URL, "agent-a", 5, [1, 2, 3])
    assert index.overlap(URL, [1, 2, 3, 4]) == 4
    assert index.nodes[URL].last_seq == 6


def test_in_order_batches_store_and_remove():
    index = synced([1, 2])
    assert not index.apply(URL, batch(1, stored=[3]))
    assert not index.apply(URL, batch(2, removed=[2]))
    assert index.overlap(URL, [1, 2, 3]) == 1  # leading blocks only: 2 is gone
    assert index.overlap(URL, [1]) == 1 and index.overlap("http://other", [1]) == 0


def test_a_gap_drops_the_node_and_resynchronises():
    index = synced([1, 2, 3])
    assert index.apply(URL, batch(3, removed=[3]))  # 1 and 2 were missed
    assert index.num_gaps == 1
    assert index.overlap(URL, [1]) == 0  # untrusted until the snapshot
    assert not index.apply(URL, batch(4, stored=[9]))
    index.load_snapshot(URL, "agent-a", 3, [1, 2])
    assert index.overlap(URL, [1, 2, 9]) == 3


def test_a_reordered_older_batch_is_ignored():
    index = synced([1])
    assert not index.apply(URL, batch(1, stored=[2]))
    assert not index.apply(URL, batch(2, removed=[2]))
    assert not index.apply(URL, batch(1, stored=[2]))  # arrives again, late
    assert index.num_stale == 1
    assert index.overlap(URL, [1, 2]) == 1


def test_a_snapshot_older_than_the_buffer_leaves_a_hole_and_resyncs_again():
    index = synced([1])
    assert index.apply(URL, batch(5, stored=[2]))  # gap
    index.load_snapshot(URL, "agent-a", 3, [1])  # snapshot at 3, buffer starts at 5
    assert index.nodes[URL].resyncing
    assert index.overlap(URL, [1]) == 1  # the snapshot itself is kept


def test_a_restarted_node_is_a_new_agent_and_starts_over():
    index = synced([1, 2])
    assert index.apply(URL, batch(1, stored=[7], node="agent-b"))
    assert index.overlap(URL, [1]) == 0
    # a snapshot from the old agent does not resurrect its buffer
    index.load_snapshot(URL, "agent-b", 0, [])
    assert index.overlap(URL, [7]) == 1


def test_failed_resync_forgets_the_node():
    index = synced([1])
    index.apply(URL, batch(9))
    index.resync_failed(URL)
    assert URL not in index.nodes
    assert index.apply(URL, batch(10))  # the next batch asks again


def test_a_snapshot_that_leaves_a_hole_asks_again_until_one_fits():
    index = synced([1])
    assert index.apply(URL, batch(5, stored=[2]))  # gap
    assert not index.apply(URL, batch(6, stored=[3]))
    assert index.load_snapshot(URL, "agent-a", 3, [1])  # hole at 4: ask again
    assert not index.apply(URL, batch(7, stored=[4]))  # still buffered
    assert not index.load_snapshot(URL, "agent-a", 4, [1])  # in sync: done
    assert not index.nodes[URL].resyncing
    assert index.overlap(URL, [1, 2, 3, 4]) == 4
    assert index.nodes[URL].last_seq == 7


def test_resync_attempts_are_bounded_then_the_node_is_forgotten():
    index = PrefixIndex(max_resync_attempts=3)
    assert index.apply(URL, batch(5))
    assert index.load_snapshot(URL, "agent-a", 3, [])
    assert index.load_snapshot(URL, "agent-a", 3, [])
    assert not index.load_snapshot(URL, "agent-a", 3, [])  # third attempt: give up
    assert URL not in index.nodes and index.num_resync_given_up == 1
    assert index.apply(URL, batch(6))  # the next batch starts over


def test_the_resync_buffer_is_bounded_and_keeps_the_newest():
    index = PrefixIndex(max_buffered=4)
    assert index.apply(URL, batch(1))
    for seq in range(2, 12):
        assert not index.apply(URL, batch(seq, stored=[seq]))
        assert len(index.nodes[URL].buffered) <= 4
    assert index.num_dropped == 8
    # a snapshot that reaches the kept batches replays them
    assert not index.load_snapshot(URL, "agent-a", 9, [9])
    assert index.overlap(URL, [9, 10, 11]) == 3
