"""The prefix index's tiers: device, host and disk hashes kept apart, matched as one run,
and all of them resynchronised after a gap."""

from __future__ import annotations

from tandem.engine.api.kv_events import KVEventBatch, Load
from tandem.router.kv_index import NO_MATCH, PrefixIndex, PrefixMatch

LOAD = Load(0, 0, 10, 10)
URL = "http://n1"


def batch(seq: int, node: str = "agent-a", **lists: list[int]) -> KVEventBatch:
    device = {"stored": lists.pop("stored", []), "removed": lists.pop("removed", [])}
    return KVEventBatch(seq, node, device["stored"], device["removed"], LOAD, **lists)


def synced(hashes=(), host=(), disk=()) -> PrefixIndex:
    index = PrefixIndex()
    assert index.apply(URL, batch(0))  # first contact: resync
    assert not index.load_snapshot(URL, "agent-a", 0, list(hashes), list(host), list(disk))
    return index


def test_each_tier_stores_and_removes_its_own_hashes():
    index = synced()
    index.apply(URL, batch(1, stored=[1], host_stored=[2], disk_stored=[3]))
    assert index.match(URL, [1, 2, 3]) == PrefixMatch(1, 1, 1)
    index.apply(URL, batch(2, host_removed=[2]))
    assert index.match(URL, [1, 2, 3]) == PrefixMatch(1, 0, 0)  # 3 is past the hole at 2
    index.apply(URL, batch(3, removed=[1]))
    assert index.match(URL, [1, 2, 3]) == NO_MATCH


def test_a_block_in_device_and_host_counts_as_device_until_the_device_drops_it():
    index = synced()
    index.apply(URL, batch(1, stored=[1, 2], host_stored=[1, 2]))  # written through
    assert index.match(URL, [1, 2]) == PrefixMatch(device_blocks=2)
    index.apply(URL, batch(2, removed=[2]))  # evicted from the device, still in host
    assert index.match(URL, [1, 2]) == PrefixMatch(device_blocks=1, host_blocks=1)


def test_a_move_from_host_to_disk_in_one_batch():
    index = synced(host=[1, 2])
    index.apply(URL, batch(1, host_removed=[2], disk_stored=[2]))
    assert index.match(URL, [1, 2]) == PrefixMatch(host_blocks=1, disk_blocks=1)
    assert index.nodes[URL].host == {1} and index.nodes[URL].disk == {2}


def test_the_run_spans_tiers_and_ends_at_the_first_block_in_none():
    index = synced(hashes=[1, 5], host=[2], disk=[3])
    assert index.match(URL, [1, 2, 3, 4, 5]) == PrefixMatch(1, 1, 1)  # 5 follows a miss
    assert index.match(URL, [3, 2, 1]) == PrefixMatch(1, 1, 1)  # the order is the prompt's
    assert index.match(URL, [4, 1]) == NO_MATCH
    assert index.overlap(URL, [1, 2, 3, 4]) == 3  # the run's length, in any tier


def test_a_gap_clears_every_tier_and_the_snapshot_restores_them_under_the_replay():
    index = synced(hashes=[1], host=[2], disk=[3])
    assert index.apply(URL, batch(3, host_stored=[4]))  # 1 and 2 were missed: resync
    assert index.match(URL, [1, 2, 3]) == NO_MATCH  # untrusted until the snapshot
    assert not index.apply(URL, batch(4, disk_removed=[3], disk_stored=[5]))
    assert not index.load_snapshot(URL, "agent-a", 2, [1], host=[2], disk=[3])
    assert index.match(URL, [1, 2, 4]) == PrefixMatch(1, 2, 0)  # batch 3 replayed
    assert index.match(URL, [1, 2, 3]) == PrefixMatch(1, 1, 0)  # batch 4 dropped 3
    assert index.match(URL, [1, 2, 5]) == PrefixMatch(1, 1, 1)


def test_a_restarted_node_starts_over_in_every_tier():
    index = synced(hashes=[1], host=[2], disk=[3])
    assert index.apply(URL, batch(1, node="agent-b"))
    index.load_snapshot(URL, "agent-b", 1, [])  # its new pools are empty
    for block_hash in (1, 2, 3):
        assert index.match(URL, [block_hash]) == NO_MATCH
