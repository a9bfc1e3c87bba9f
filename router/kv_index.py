"""Which worker has which prompt blocks cached, in which tier, built from the workers' KV
events.

Each worker's hashes are kept per tier (device, host, disk) in separate sets: a node writes
device blocks through to its host tier, so one hash may be in several at once, and each
tier's events add and remove only its own. A prompt's match with a worker is its longest
leading run of blocks held in any tier, each block counted in the cheapest tier holding it.

Each worker's batches carry a sequence number. A batch that follows the last one is
applied. An older one (a duplicate or a reordered message) is dropped. A gap (missed
messages) or a new agent name (the node restarted) makes the worker's hashes untrusted:
they are cleared and the index asks for a resync (`GET /kv/snapshot`, every cached hash
of every tier with the sequence number it reflects); batches that arrive meanwhile are
buffered and replayed on top of the snapshot. Until then the worker simply looks uncached: a stale
index can only cost cache hits, never correctness.

A snapshot that still leaves a hole before the buffer is asked for again, at most
`max_resync_attempts` times in a row (the caller spaces the attempts); after that the worker
is forgotten and its next batch starts over. The buffer holds at most `max_buffered`
batches: one more drops them all (counted in `num_dropped`) and keeps only the newest, so
the snapshot being fetched either reaches it or leaves a hole and is asked for again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tandem.engine.api.kv_events import KVEventBatch


@dataclass(frozen=True)
class PrefixMatch:
    """A prompt's leading blocks found on one worker, each counted in the cheapest tier
    holding it (device, then host, then disk); the run ends at the first block in none."""

    device_blocks: int = 0
    host_blocks: int = 0
    disk_blocks: int = 0

    @property
    def num_blocks(self) -> int:
        return self.device_blocks + self.host_blocks + self.disk_blocks


NO_MATCH = PrefixMatch()


@dataclass
class NodeBlocks:
    agent: str | None = None
    last_seq: int | None = None
    device: set[int] = field(default_factory=set)
    host: set[int] = field(default_factory=set)
    disk: set[int] = field(default_factory=set)
    resyncing: bool = False
    buffered: list[KVEventBatch] = field(default_factory=list)
    num_resync_attempts: int = 0  # snapshots asked for since the worker was last in sync


class PrefixIndex:
    """Block hashes per worker URL. Not thread-safe: one owner (the router's event loop)."""

    def __init__(self, max_buffered: int = 1024, max_resync_attempts: int = 5) -> None:
        self.max_buffered = max_buffered
        self.max_resync_attempts = max_resync_attempts
        self.nodes: dict[str, NodeBlocks] = {}
        self.num_gaps = 0
        self.num_stale = 0
        self.num_dropped = 0  # buffered batches dropped over `max_buffered`
        self.num_resync_given_up = 0

    def apply(self, url: str, batch: KVEventBatch) -> bool:
        """Apply one batch; returns True when the caller should fetch a snapshot now."""
        node = self.nodes.setdefault(url, NodeBlocks())
        if node.resyncing:
            if len(node.buffered) >= self.max_buffered:
                self.num_dropped += len(node.buffered)
                node.buffered = []
            node.buffered.append(batch)
            return False
        if node.agent == batch.node and node.last_seq is not None:
            if batch.seq <= node.last_seq:
                self.num_stale += 1
                return False
            if batch.seq == node.last_seq + 1:
                self._apply(node, batch)
                return False
            self.num_gaps += 1
        self.forget(url)
        node = self.nodes.setdefault(url, NodeBlocks())
        node.agent, node.resyncing, node.buffered = batch.node, True, [batch]
        node.num_resync_attempts = 1
        return True

    def load_snapshot(
        self,
        url: str,
        agent: str,
        seq: int,
        hashes: Sequence[int],
        host: Sequence[int] = (),
        disk: Sequence[int] = (),
    ) -> bool:
        """Replace the worker's hashes of every tier by a snapshot (`hashes`: the device
        pool's), then replay the newer buffered batches (from the same agent). Returns True
        when a hole remains before the buffer and the caller should fetch another snapshot;
        after `max_resync_attempts` the worker is forgotten instead (False)."""
        node = self.nodes.setdefault(url, NodeBlocks())
        buffered = [b for b in node.buffered if b.node == agent and b.seq > seq]
        node.agent, node.last_seq = agent, seq
        node.device, node.host, node.disk = set(hashes), set(host), set(disk)
        node.resyncing, node.buffered = False, []
        buffered.sort(key=lambda b: b.seq)
        for i, batch in enumerate(buffered):
            if batch.seq == node.last_seq + 1:
                self._apply(node, batch)
            else:  # still a hole between the snapshot and the buffer: keep what follows it
                self.num_gaps += 1
                node.resyncing, node.buffered = True, buffered[i:]
                return self._ask_again(url, node)
        node.num_resync_attempts = 0
        return False

    def resync_failed(self, url: str) -> None:
        """The snapshot could not be fetched: start over at the next batch."""
        self.forget(url)

    def _ask_again(self, url: str, node: NodeBlocks) -> bool:
        if node.num_resync_attempts >= self.max_resync_attempts:
            self.num_resync_given_up += 1
            self.forget(url)
            return False
        node.num_resync_attempts += 1
        return True

    def forget(self, url: str) -> None:
        self.nodes.pop(url, None)

    def match(self, url: str, block_hashes: Sequence[int]) -> PrefixMatch:
        """The prompt's leading blocks the worker holds, per tier."""
        node = self.nodes.get(url)
        if node is None:
            return NO_MATCH
        device = host = disk = 0
        for block_hash in block_hashes:
            if block_hash in node.device:
                device += 1
            elif block_hash in node.host:
                host += 1
            elif block_hash in node.disk:
                disk += 1
            else:
                break
        return PrefixMatch(device, host, disk)

    def overlap(self, url: str, block_hashes: Sequence[int]) -> int:
        """How many leading blocks of the prompt the worker holds, in any tier."""
        return self.match(url, block_hashes).num_blocks

    @staticmethod
    def _apply(node: NodeBlocks, batch: KVEventBatch) -> None:
        """Stored, then removed: a hash in both lists of one tier reads as removed (an
        under-report, never an over-report)."""
        _update(node.device, batch.stored, batch.removed)
        _update(node.host, batch.host_stored, batch.host_removed)
        _update(node.disk, batch.disk_stored, batch.disk_removed)
        node.last_seq = batch.seq


def _update(hashes: set[int], stored: list[int], removed: list[int]) -> None:
    hashes.update(stored)
    hashes.difference_update(removed)
