"""The KV-event wire format across versions, and the publisher's tier lists."""

from __future__ import annotations

import msgspec
import pytest
import zmq

from tandem.engine.api.kv_events import (
    KVEventBatch,
    KVEventPublisher,
    KVSnapshot,
    Load,
    TierEvents,
    decode_batch,
    decode_snapshot,
)

LOAD = Load(1, 2, 30, 40)


class DeviceOnlyBatch(msgspec.Struct, frozen=True):
    """`KVEventBatch` as a publisher without lower tiers sends it."""

    seq: int
    node: str
    stored: list[int]
    removed: list[int]
    load: Load


class Sent:
    """Stands in for the PUB socket: keeps what `publish` sends."""

    def __init__(self) -> None:
        self.batches: list[KVEventBatch] = []

    def send(self, data: bytes, _flags: int = 0) -> None:
        self.batches.append(decode_batch(data))

    def close(self, _linger: int = 0) -> None:
        pass


@pytest.fixture
def publisher():
    context = zmq.Context()
    publisher = KVEventPublisher(context, "127.0.0.1", 0, "agent-a")
    publisher.socket.close(0)
    publisher.socket = Sent()
    yield publisher
    context.term()


def test_a_batch_without_tier_fields_decodes_with_empty_tiers():
    old = DeviceOnlyBatch(3, "agent-a", [1, 2], [9], LOAD)
    batch = decode_batch(msgspec.msgpack.encode(old))
    assert (batch.seq, batch.node, batch.stored, batch.removed, batch.load) == (
        3, "agent-a", [1, 2], [9], LOAD,
    )  # fmt: skip
    assert batch.host_stored == batch.host_removed == []
    assert batch.disk_stored == batch.disk_removed == []


def test_a_subscriber_without_tier_fields_still_decodes_a_new_batch():
    new = KVEventBatch(4, "agent-a", [1], [], LOAD, host_stored=[5], disk_removed=[6])
    old = msgspec.msgpack.decode(msgspec.msgpack.encode(new), type=DeviceOnlyBatch)
    assert (old.seq, old.stored, old.load) == (4, [1], LOAD)


def test_a_snapshot_without_tier_lists_decodes_and_one_without_hashes_is_refused():
    snapshot = decode_snapshot(b'{"node": "agent-a", "seq": 7, "hashes": [1, 2]}')
    assert snapshot == KVSnapshot("agent-a", 7, [1, 2])
    assert snapshot.host_hashes == snapshot.disk_hashes == []
    with pytest.raises(ValueError):
        decode_snapshot(b'{"node": "agent-a", "seq": 7}')


def test_the_publisher_sends_each_tier_in_its_own_lists(publisher):
    tiers = TierEvents(host_stored=[1, 2], host_removed=[3], disk_stored=[3], disk_removed=[4])
    assert publisher.publish([(True, 1), (False, 8)], LOAD, tiers=tiers)
    (batch,) = publisher.socket.batches
    assert (batch.stored, batch.removed) == ([1], [8])
    assert (batch.host_stored, batch.host_removed) == ([1, 2], [3])  # 3 moved host -> disk
    assert (batch.disk_stored, batch.disk_removed) == ([3], [4])


def test_tier_changes_alone_are_published_and_no_change_is_not(publisher):
    assert publisher.publish([], LOAD)  # the first load
    assert not publisher.publish([], LOAD)  # nothing new, heartbeat not due
    assert publisher.publish([], LOAD, tiers=TierEvents(disk_stored=[5]))
    assert not publisher.publish([], LOAD, tiers=TierEvents())
    first, second = publisher.socket.batches
    assert first.disk_stored == [] and second.disk_stored == [5]
    assert second.seq == first.seq + 1
