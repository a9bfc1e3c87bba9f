"""Which worker has which prompt blocks cached, built from the workers' KV events.

Each worker's batches carry a sequence number. A batch that follows the last one is
applied. An older one (a duplicate or a reordered message) is dropped. A gap (missed
messages) or a new agent name (the node restarted) makes the worker's hashes untrusted:
they are cleared and the index asks for a resync (`GET /kv/snapshot`, every cached hash
with the sequence number it reflects); batches that arrive meanwhile are buffered and
replayed on top of the snapshot. Until then the worker simply looks uncached: a stale
index can only cost cache hits, never correctness.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tandem.engine.kv_events import KVEventBatch


@dataclass
class NodeBlocks:
    agent: str | None = None
    last_seq: int | None = None
    hashes: set[int] = field(default_factory=set)
    resyncing: bool = False
    buffered: list[KVEventBatch] = field(default_factory=list)


class PrefixIndex:
    """Block hashes per worker URL. Not thread-safe: one owner (the router's event loop)."""

    def __init__(self) -> None:
        self.nodes: dict[str, NodeBlocks] = {}
        self.num_gaps = 0
        self.num_stale = 0

    def apply(self, url: str, batch: KVEventBatch) -> bool:
        """Apply one batch; returns True when the caller should fetch a snapshot now."""
        node = self.nodes.setdefault(url, NodeBlocks())
        if node.resyncing:
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
        return True

    def load_snapshot(self, url: str, agent: str, seq: int, hashes: Sequence[int]) -> None:
        """Replace the worker's hashes by a snapshot, then replay the newer buffered batches
        (from the same agent)."""
        node = self.nodes.setdefault(url, NodeBlocks())
        buffered = [b for b in node.buffered if b.node == agent and b.seq > seq]
        node.agent, node.last_seq, node.hashes = agent, seq, set(hashes)
        node.resyncing, node.buffered = False, []
        for batch in sorted(buffered, key=lambda b: b.seq):
            if batch.seq == node.last_seq + 1:
                self._apply(node, batch)
            else:  # still a hole between the snapshot and the buffer
                self.num_gaps += 1
                node.resyncing, node.buffered = True, [batch]
                return

    def resync_failed(self, url: str) -> None:
        """The snapshot could not be fetched: start over at the next batch."""
        self.forget(url)

    def forget(self, url: str) -> None:
        self.nodes.pop(url, None)

    def overlap(self, url: str, block_hashes: Sequence[int]) -> int:
        """How many leading blocks of the prompt the worker has cached."""
        node = self.nodes.get(url)
        if node is None:
            return 0
        n = 0
        for block_hash in block_hashes:
            if block_hash not in node.hashes:
                break
            n += 1
        return n

    @staticmethod
    def _apply(node: NodeBlocks, batch: KVEventBatch) -> None:
        node.hashes.update(batch.stored)
        node.hashes.difference_update(batch.removed)
        node.last_seq = batch.seq
