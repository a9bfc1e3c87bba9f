"""One rank's end of the KV transfer: its NIXL agent over its own cache, the staging mirrors
it re-packs blocks into when a decode rank wants only part of its heads, the writes it has
posted, and the in-place re-pack of blocks that received pieces from several prefill ranks.

Rank 0 of a node uses its `RankKV` directly; ranks 1..N-1 own theirs in their process
(`tandem.engine.parallel.rank_main`) and act on commands from rank 0 (`NodeAgent`), reporting each
write's end back to it. A staging mirror has the cache's block count and block size, so
block `b` of a write is staged at slot `b`: two writes of one block at once (a cached
prefix sent to two decode nodes) stage the same bytes there. The mirrors are allocated
with the rank's agent, one per split of its heads that the memory plan counted
(`tandem.engine.transfer.kv_staging`); a write never allocates one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tandem.engine.transfer.kv_heads import (
    HeadRange,
    Piece,
    cuts_of,
    head_range,
    is_whole,
    piece_descs,
)
from tandem.engine.transfer.kv_heads import repack as repack_blocks
from tandem.engine.transfer.kv_heads import stage as stage_blocks
from tandem.engine.transfer.messages import AgentInfo
from tandem.engine.transfer.nixl_agent import KVTransferAgent, Transfer


@dataclass(frozen=True)
class PeerPiece:
    """The piece this rank sends to one rank of the other node, and that rank's agent."""

    peer: AgentInfo
    piece: Piece


class RankKV:
    """Owns one rank's agent, staging mirrors and in-flight writes. One thread uses it."""

    def __init__(
        self,
        agent: KVTransferAgent,
        kv_cache: torch.Tensor,
        staging_cuts: Sequence[tuple[HeadRange, ...]] = (),
    ) -> None:
        """`kv_cache`: [num_blocks, L, 2, block_size, this rank's KV heads, D], registered
        with `agent`. One staging mirror is allocated and registered now for each split in
        `staging_cuts` (the plan's, `kv_staging.staging_cuts`)."""
        self.agent = agent
        self.kv_cache = kv_cache
        self._staging: dict[tuple[HeadRange, ...], torch.Tensor] = {}
        shape = (kv_cache.shape[0], kv_cache[0].numel())  # [num_blocks, block elements]
        for cuts in staging_cuts:
            staging = torch.zeros(shape, dtype=kv_cache.dtype, device=kv_cache.device)
            agent.register(staging)
            self._staging[tuple(cuts)] = staging
        self._in_flight: dict[int, list[Transfer]] = {}  # write id -> its transfers
        self._failed: set[int] = set()  # writes of which a part could not be posted

    @property
    def heads(self) -> HeadRange:
        return head_range(self.agent.layout)

    @property
    def num_in_flight(self) -> int:
        return len(self._in_flight)

    def write(
        self, write_id: int, parts: list[PeerPiece], src_ids: list[int], dst_ids: list[int]
    ) -> str:
        """Post one WRITE per peer rank of blocks `src_ids` into its `dst_ids`; the state
        of the whole (PROC, DONE or ERR). Raises when NIXL refuses the first post (nothing
        of this write is then in flight); a later refusal ends the whole as ERR once the
        posted ones have landed."""
        staging = self._staged(parts, src_ids)
        if self.kv_cache.is_cuda:
            torch.cuda.synchronize(self.kv_cache.device)  # NIXL reads outside stream order
        layout = self.agent.layout
        transfers = []
        try:
            for part in parts:
                self.agent.connect(part.peer)
                whole = is_whole(part.piece, self.heads)
                base = layout.base_addr if whole else staging.data_ptr()
                local, far = piece_descs(
                    layout, base, whole, part.peer.layout, part.piece, src_ids, dst_ids
                )
                transfers.append(self.agent.write_descs(part.peer.name, local, far, len(src_ids)))
        except Exception:
            if not transfers:
                raise
            self._failed.add(write_id)  # the posted ones still land: wait for them
        self._in_flight[write_id] = transfers
        return self._state(write_id)

    @property
    def num_mirrors(self) -> int:
        return len(self._staging)

    def _staged(self, parts: list[PeerPiece], src_ids: list[int]) -> torch.Tensor | None:
        """The blocks re-packed into pieces, when a piece is not all of our heads. Raises
        ValueError (nothing posted) when no mirror was planned for this split."""
        if all(is_whole(p.piece, self.heads) for p in parts):
            return None
        cuts = tuple(cuts_of([p.piece for p in parts], self.heads))
        staging = self._staging.get(cuts)
        if staging is None:
            raise ValueError(
                f"no staging mirror planned for KV heads split as {list(cuts)}: start this "
                "node with --peer-tensor-parallel-sizes naming its peers' sizes"
            )
        stage_blocks(self.kv_cache, staging, src_ids, list(cuts))
        return staging

    def _state(self, write_id: int) -> str:
        states = [self.agent.poll(t) for t in self._in_flight[write_id]]
        if "PROC" in states:
            return "PROC"
        del self._in_flight[write_id]
        failed = write_id in self._failed
        self._failed.discard(write_id)
        return "ERR" if failed or "ERR" in states else "DONE"

    def poll(self) -> list[tuple[int, str]]:
        """(write id, DONE or ERR) for every write that ended since the last call."""
        ended = []
        for write_id in list(self._in_flight):
            state = self._state(write_id)
            if state != "PROC":
                ended.append((write_id, state))
        return ended

    def repack(self, block_ids: list[int], cuts: list[HeadRange]) -> None:
        """Blocks that received the pieces `cuts` one after another, laid out token-major."""
        repack_blocks(self.kv_cache, block_ids, cuts)
