"""KV events and load, published by every node on a ZMQ PUB socket for routers.

Each message carries a sequence number per publisher (and the publisher's agent name), so
a subscriber that sees a gap, or a new name, knows it missed events and resynchronises
(the router's prefix index treats a node's hashes as stale then). Hashes are the design's
stable 64-bit block hashes, the same the router computes from a prompt.
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


class KVEventBatch(msgspec.Struct, frozen=True):
    seq: int
    node: str
    stored: list[int]
    removed: list[int]
    load: Load


_decoder = msgspec.msgpack.Decoder(KVEventBatch)


def decode_batch(data: bytes) -> KVEventBatch:
    return _decoder.decode(data)


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

    def publish(self, events: list[tuple[bool, int]], load: Load) -> bool:
        """Send stored/removed hashes and the load, if anything changed or a heartbeat is
        due. Returns whether a message went out."""
        now = time.monotonic()
        if not events and load == self._last_load and now - self._last_sent < HEARTBEAT_S:
            return False
        self.seq += 1
        batch = KVEventBatch(
            self.seq,
            self.node,
            [h for stored, h in events if stored],
            [h for stored, h in events if not stored],
            load,
        )
        self.socket.send(self._encoder.encode(batch), zmq.NOBLOCK)
        self._last_load, self._last_sent = load, now
        return True

    def close(self) -> None:
        self.socket.close(0)
