"""KV events and load, published by every node on a ZMQ PUB socket for routers.

Each message carries a sequence number per publisher (and the publisher's agent name), so
a subscriber that sees a gap, or a new name, knows it missed events and resynchronises
(the router's prefix index treats a node's hashes as stale then). Hashes are the design's
stable 64-bit block hashes, the same the router computes from a prompt.

A node with lower KV tiers (host memory, disk: blocks evicted from the device pool move
down instead of being dropped) reports them beside the device pool's: a hash may be held in
several tiers at once (the device pool writes through to host), and one moving from host to
disk appears in `host_removed` and `disk_stored` of the same batch. The tier fields default
to empty, so a batch from a publisher without them still decodes, and a subscriber without
them ignores them (msgspec skips unknown fields).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import msgspec
import zmq

if TYPE_CHECKING:
    from tandem.engine.core.scheduler import Scheduler

# Publish load at least this often even when nothing changed (a heartbeat).
HEARTBEAT_S = 1.0


class Load(msgspec.Struct, frozen=True):
    running: int
    waiting: int
    free_blocks: int
    total_blocks: int


def load_of(scheduler: Scheduler) -> Load:
    """A node's load as routers see it: requests waiting for remote KV or for a load from a
    lower KV tier count as waiting."""
    kv = scheduler.kv
    return Load(
        running=len(scheduler.running),
        waiting=len(scheduler.waiting) + len(scheduler.remote) + len(scheduler.loading),
        free_blocks=kv.pool.num_free_blocks,
        total_blocks=kv.num_blocks,
    )


class TierEvents(msgspec.Struct, frozen=True):
    """One engine iteration's changes to the lower tiers, handed to `publish` by the engine
    (the device pool's own changes go as `events`). The lists are the caller's; `publish`
    only reads them."""

    host_stored: list[int] = []
    host_removed: list[int] = []
    disk_stored: list[int] = []
    disk_removed: list[int] = []

    @property
    def empty(self) -> bool:
        return not (self.host_stored or self.host_removed or self.disk_stored or self.disk_removed)


NO_TIER_EVENTS = TierEvents()


class KVEventBatch(msgspec.Struct, frozen=True):
    """`stored`/`removed`: device-pool hashes; the `host_*` and `disk_*` lists: the lower
    tiers' (empty from a node without them)."""

    seq: int
    node: str
    stored: list[int]
    removed: list[int]
    load: Load
    host_stored: list[int] = []
    host_removed: list[int] = []
    disk_stored: list[int] = []
    disk_removed: list[int] = []


_decoder = msgspec.msgpack.Decoder(KVEventBatch)


def decode_batch(data: bytes) -> KVEventBatch:
    return _decoder.decode(data)


class KVSnapshot(msgspec.Struct, frozen=True):
    """`GET /kv/snapshot`'s body: every hash each tier holds, as of batch `seq` of `node`.
    The tier lists default to empty, as in `KVEventBatch`."""

    node: str
    seq: int
    hashes: list[int]  # the device pool's
    host_hashes: list[int] = []
    disk_hashes: list[int] = []


def decode_snapshot(data: bytes) -> KVSnapshot:
    """Raises msgspec.DecodeError (a ValueError) for a body that is not a KVSnapshot."""
    return msgspec.json.decode(data, type=KVSnapshot)


class KVEventPublisher:
    """Owns the PUB socket; `publish` is called once per engine iteration."""

    def __init__(self, context: zmq.Context, host: str, port: int, node: str) -> None:
        """Bind on `host:port` (port 0: any free port; `port` then tells which)."""
        self.socket = context.socket(zmq.PUB)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(f"tcp://{host}:{port or '*'}")
        self.port = int(self.socket.getsockopt(zmq.LAST_ENDPOINT).decode().rsplit(":", 1)[1])
        self.node = node
        self.seq = 0
        self._last_load: Load | None = None
        self._last_sent = 0.0
        self._encoder = msgspec.msgpack.Encoder()

    def publish(
        self, events: list[tuple[bool, int]], load: Load, tiers: TierEvents = NO_TIER_EVENTS
    ) -> bool:
        """Send the device pool's `events` ((stored?, hash), in order), the lower tiers'
        changes and the load, if anything changed or a heartbeat is due. Returns whether a
        message went out. Reads `events` and `tiers`; clearing them is the caller's."""
        now = time.monotonic()
        quiet = not events and tiers.empty and load == self._last_load
        if quiet and now - self._last_sent < HEARTBEAT_S:
            return False
        self.seq += 1
        batch = KVEventBatch(
            self.seq,
            self.node,
            [h for stored, h in events if stored],
            [h for stored, h in events if not stored],
            load,
            tiers.host_stored,
            tiers.host_removed,
            tiers.disk_stored,
            tiers.disk_removed,
        )
        self.socket.send(self._encoder.encode(batch), zmq.NOBLOCK)
        self._last_load, self._last_sent = load, now
        return True

    def close(self) -> None:
        self.socket.close(0)
