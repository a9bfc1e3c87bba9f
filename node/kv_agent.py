"""A node's KV transfer across its tensor-parallel ranks, as rank 0 drives it.

Every rank has its own NIXL agent over its own cache (`RankKV`); a node describes itself to
the other side as rank 0's `AgentInfo` plus those of ranks 1..N-1. A write of blocks to a
decode node becomes one WRITE per (prefill rank, decode rank) pair that share KV heads
(`kv_heads.plan_pieces`), each posted by the prefill rank that holds them, straight into the
decode rank that wants them: no KV passes through rank 0. Rank 0 posts its own and sends the
others a command; the write is done when every rank has reported its part done, and only
then does rank 0 send `PrefillDone` (from its agent to the decode node's rank 0), so the
notification still arrives after every byte. A decode node whose ranks received pieces
from several prefill ranks re-packs those blocks (`repack`) before the request runs.

At one rank this is rank 0's agent and nothing else.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from tandem.engine.model_runner import ModelRunner
from tandem.engine.parallel.rank_processes import RankProcesses
from tandem.engine.transfer.kv_heads import (
    HeadRange,
    cuts_of,
    head_bytes,
    head_range,
    num_descs,
    plan_pieces,
)
from tandem.engine.transfer.kv_staging import rank_staging_cuts
from tandem.engine.transfer.messages import AgentInfo, KVLayout
from tandem.engine.transfer.nixl_agent import (
    MAX_REMOTE_AGENTS,
    KVTransferAgent,
    Transfer,
    new_agent_name,
)
from tandem.engine.transfer.rank_kv import PeerPiece, RankKV

# How long the census waits for a rank's answer.
_CENSUS_WAIT_S = 1.0


@dataclass
class _Write:
    pending: set[int]  # ranks whose part has not ended
    failed: bool = False


class NodeAgent:
    """Rank 0's view of every rank's transfer end. One thread (the engine's) uses it."""

    def __init__(
        self, local: RankKV, workers: RankProcesses | None, ranks: list[AgentInfo]
    ) -> None:
        """`ranks`: every rank's agent, rank 0's (`local`'s) first."""
        self.local = local
        self.workers = workers
        self.ranks = ranks
        self._peers: OrderedDict[str, list[AgentInfo]] = OrderedDict()  # decode nodes' ranks
        self._writes: dict[int, _Write] = {}
        self._next_id = 0
        self._expecting = False

    @classmethod
    def create(cls, prefix: str, runner: ModelRunner) -> NodeAgent:
        """Rank 0's agent named `prefix` plus a boot id; rank r's that name and `-r{r}`."""
        name = new_agent_name(prefix)
        shape, total = runner.shard.tp.shape, runner.config.model.num_kv_heads
        agent = KVTransferAgent(name, runner.kv_cache, shape.kv_head_start, total)
        ranks = [agent.info()]
        if runner.workers is not None:
            for rank in range(1, runner.shard.tp.size):
                ranks.append(runner.workers.call(rank, "agent", f"{name}-r{rank}"))
        cuts = rank_staging_cuts(runner.config, 0)
        return cls(RankKV(agent, runner.kv_cache, cuts), runner.workers, ranks)

    @property
    def name(self) -> str:
        return self.local.agent.name

    @property
    def layout(self) -> KVLayout:
        return self.local.agent.layout

    def info(self) -> AgentInfo:
        return self.ranks[0]

    def rank_infos(self) -> list[AgentInfo]:
        """Ranks 1..N-1's agents (none at one rank)."""
        return self.ranks[1:]

    def head_ranges(self) -> list[HeadRange]:
        return [head_range(info.layout) for info in self.ranks]

    @property
    def node_block_bytes(self) -> int:
        """Bytes of one block over every KV head of the model."""
        return head_bytes(self.layout) * self.layout.total_kv_heads

    # -- the prefill side -----------------------------------------------------------------

    def connect(self, info: AgentInfo, ranks: Sequence[AgentInfo] = ()) -> None:
        """Remember a decode node's ranks; rank 0 loads its rank 0 (for notifications)."""
        self.local.agent.connect(info)
        self._peers[info.name] = [info, *ranks]
        self._peers.move_to_end(info.name)
        while len(self._peers) > MAX_REMOTE_AGENTS:
            self._peers.popitem(last=False)

    def remote_layout(self, name: str) -> KVLayout:
        """The decode node's rank 0 cache."""
        return self._peers[name][0].layout

    def check_peer(self, name: str) -> None:
        """Raise ValueError when the decode node's KV blocks cannot take ours."""
        peers, mine = self._peers[name], self.layout
        far = peers[0].layout
        if far.total_kv_heads != mine.total_kv_heads or head_bytes(far) != head_bytes(mine):
            raise ValueError(
                f"KV block size mismatch: {far.total_kv_heads} KV heads of "
                f"{head_bytes(far)} bytes a block there, {mine.total_kv_heads} of "
                f"{head_bytes(mine)} here (another model or block size?)"
            )
        plan_pieces(self.head_ranges(), [head_range(p.layout) for p in peers])

    def write_blocks(self, remote: str, src_ids: list[int], dst_ids: list[int]) -> Transfer:
        """Post our blocks `src_ids` into the decode node's `dst_ids`, from every rank to
        the ranks holding its heads. Raises when rank 0's part cannot be posted (nothing is
        then in flight); a part refused on another rank ends the write as ERR."""
        peers, heads = self._peers[remote], self.head_ranges()
        pieces = plan_pieces(heads, [head_range(p.layout) for p in peers])
        parts: dict[int, list[PeerPiece]] = {}
        for piece in pieces:
            parts.setdefault(piece.src, []).append(PeerPiece(peers[piece.dst], piece))
        write_id, self._next_id = self._next_id, self._next_id + 1
        write = _Write(pending=set())
        if 0 in parts:  # first: a refusal here raises with nothing in flight
            state = self.local.write(write_id, parts[0], src_ids, dst_ids)
            write.pending |= {0} if state == "PROC" else set()
            write.failed = state == "ERR"
        self._writes[write_id] = write
        for rank, rank_parts in parts.items():
            if rank:
                try:
                    self.workers.send(rank, ("write", write_id, rank_parts, src_ids, dst_ids))
                    write.pending.add(rank)
                except OSError:  # the rank is gone (its watcher ends the node): no part there
                    write.failed = True
        transfer = Transfer(
            write_id,
            len(src_ids),
            sum(p.num_heads for p in pieces) * head_bytes(self.layout) * len(src_ids),
            sum(
                num_descs(p, heads[p.src], head_range(peers[p.dst].layout), src_ids, dst_ids)
                for p in pieces
            ),
            time.monotonic(),
        )
        if not write.pending:
            del self._writes[write_id]
            transfer.state = "ERR" if write.failed else "DONE"
        return transfer

    def poll(self, transfer: Transfer) -> str:
        """Advance `transfer`'s state (PROC, DONE or ERR) from every rank's reports."""
        if transfer.state != "PROC":
            return transfer.state
        for write_id, state in self.local.poll():
            self._ended(0, write_id, state)
        if self.workers is not None:
            for rank, write_id, state in self.workers.reports():
                self._ended(rank, write_id, state)
        write = self._writes[transfer.handle]
        if not write.pending:
            del self._writes[transfer.handle]
            transfer.state = "ERR" if write.failed else "DONE"
        return transfer.state

    def _ended(self, rank: int, write_id: int, state: str) -> None:
        write = self._writes[write_id]
        write.pending.discard(rank)
        write.failed |= state == "ERR"

    def notify(self, remote: str, message: bytes) -> None:
        """Notify the decode node's rank 0 (loaded again if its agent was evicted)."""
        peers = self._peers.get(remote)
        if peers is not None:
            self.local.agent.connect(peers[0])
        self.local.agent.notify(remote, message)

    def notifications(self) -> list[tuple[str, bytes]]:
        return self.local.agent.notifications()

    # -- the decode side ------------------------------------------------------------------

    def expect_writes(self, expecting: bool) -> None:
        """Whether writes may be landing in our cache. Ranks 1..N-1 keep their agents
        progressing only meanwhile (some UCX transports need the target to progress; an
        idle rank polling all the time would spend a tenth of a core)."""
        if self.workers is None or expecting == self._expecting:
            return
        self._expecting = expecting
        for rank in range(1, len(self.ranks)):
            self.workers.send(rank, ("expect", expecting))

    def repack(self, block_ids: list[int], src_heads: list[HeadRange]) -> None:
        """Blocks `block_ids` received pieces from prefill ranks holding `src_heads`: on
        every rank of ours that got more than one piece, lay them out token-major. Raises
        ValueError (nothing re-packed) when those heads do not cover ours."""
        pieces = plan_pieces(src_heads, self.head_ranges())
        for rank, heads in enumerate(self.head_ranges()):
            cuts = cuts_of([p for p in pieces if p.dst == rank], heads)
            if cuts == [(0, heads[1])]:
                continue
            if rank == 0:
                self.local.repack(block_ids, cuts)
            else:
                self.workers.send(rank, ("repack", block_ids, cuts))

    def census(self) -> list[int | None]:
        """Writes in flight on each rank, by the rank's own count (None: the rank did not
        answer within a second; a stopped rank must not hang the node)."""
        counts: list[int | None] = [self.local.num_in_flight]
        if self.workers is not None:
            for rank in range(1, len(self.ranks)):
                counts.append(self.workers.call(rank, "census", timeout=_CENSUS_WAIT_S))
        return counts
