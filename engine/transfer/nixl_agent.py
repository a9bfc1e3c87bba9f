"""The NIXL agent (UCX backend) that moves KV blocks between nodes, with the node's KV tensor
registered in one region. An agent name carries a boot id, so a restarted node is a new
agent that nobody mistakes for the dead one."""

from __future__ import annotations

import logging
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass

import torch

from tandem.engine.transfer.descriptors import block_runs, run_descs
from tandem.engine.transfer.messages import AgentInfo, KVLayout

logger = logging.getLogger(__name__)

# Remote agents a prefill rank keeps loaded; the least recently used is dropped beyond this
# (agents, not nodes: a decode node of N ranks counts N on the rank writing to all of them).
MAX_REMOTE_AGENTS = 1024


@dataclass
class Transfer:
    """One posted WRITE: a NIXL handle and what it moves."""

    handle: object
    num_blocks: int
    num_bytes: int
    num_descs: int
    started: float
    state: str = "PROC"  # PROC, DONE or ERR


def new_agent_name(prefix: str) -> str:
    """`prefix` plus a boot id: unique to this process, so a restart is a new agent."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


class KVTransferAgent:
    """A NIXL agent (UCX backend) with the node's KV tensor registered in one region."""

    def __init__(
        self,
        name: str,
        kv_cache: torch.Tensor,
        kv_head_start: int = 0,
        total_kv_heads: int | None = None,
    ) -> None:
        """`kv_cache`: [num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim] (or
        any [num_blocks, ...] of opaque blocks, as one head), contiguous, on the CPU (DRAM)
        or a GPU (VRAM): this rank's KV heads
        `kv_head_start ..` of the model's `total_kv_heads` (default: all of them)."""
        from nixl._api import nixl_agent, nixl_agent_config

        if not kv_cache.is_contiguous():
            raise ValueError("the KV cache must be contiguous to register it with NIXL")
        self.name = name
        # No progress thread: it spins a core; our loops poll transfers and notifications.
        self._agent = nixl_agent(name, nixl_agent_config(False, backends=["UCX"]))
        self._registrations = [self._agent.register_memory(kv_cache)]
        num_blocks = kv_cache.shape[0]
        heads = kv_cache.shape[4] if kv_cache.dim() == 6 else 1  # else: opaque blocks
        self.layout = KVLayout(
            base_addr=kv_cache.data_ptr(),
            block_bytes=kv_cache[0].numel() * kv_cache.element_size(),
            num_blocks=num_blocks,
            device_id=max(kv_cache.get_device(), 0),
            mem_type="VRAM" if kv_cache.is_cuda else "DRAM",
            kv_head_start=kv_head_start,
            num_kv_heads=heads,
            total_kv_heads=total_kv_heads or heads,
        )
        self._remotes: OrderedDict[str, KVLayout] = OrderedDict()

    def info(self) -> AgentInfo:
        return AgentInfo(self.name, self._agent.get_agent_metadata(), self.layout)

    def connect(self, info: AgentInfo) -> None:
        """Load a remote agent's metadata once; keep at most MAX_REMOTE_AGENTS."""
        if info.name in self._remotes:
            self._remotes.move_to_end(info.name)
            return
        if info.layout.mem_type != self.layout.mem_type:
            logger.warning(
                "agent %s holds its KV in %s, we in %s",
                info.name,
                info.layout.mem_type,
                self.layout.mem_type,
            )
        self._agent.add_remote_agent(info.metadata)
        self._remotes[info.name] = info.layout
        while len(self._remotes) > MAX_REMOTE_AGENTS:
            old, _ = self._remotes.popitem(last=False)
            self._agent.remove_remote_agent(old)

    def remote_layout(self, name: str) -> KVLayout:
        return self._remotes[name]

    def register(self, tensor: torch.Tensor) -> None:
        """Register another region of ours (a staging buffer) as a write source."""
        self._registrations.append(self._agent.register_memory(tensor))

    def write_blocks(self, remote: str, src_ids: list[int], dst_ids: list[int]) -> Transfer:
        """Post one WRITE of our blocks `src_ids` into the remote's `dst_ids`."""
        runs = block_runs(src_ids, dst_ids)
        layout = self._remotes[remote]
        return self.write_descs(
            remote,
            run_descs(self.layout, runs, 0),
            run_descs(layout, runs, 1),
            len(src_ids),
        )

    def write_descs(
        self,
        remote: str,
        local: list[tuple[int, int, int]],
        far: list[tuple[int, int, int]],
        num_blocks: int,
    ) -> Transfer:
        """Post one WRITE of our regions `local` into the remote's `far` (pairwise equal
        lengths); `num_blocks` is what it moves, for the metrics."""
        layout = self._remotes[remote]
        local_descs = self._agent.get_xfer_descs(local, self.layout.mem_type)
        far_descs = self._agent.get_xfer_descs(far, layout.mem_type)
        handle = self._agent.initialize_xfer("WRITE", local_descs, far_descs, remote)
        num_bytes = sum(desc[1] for desc in local)
        transfer = Transfer(handle, num_blocks, num_bytes, len(local), time.monotonic())
        transfer.state = self._agent.transfer(handle)
        self._settle(transfer)
        return transfer

    def poll(self, transfer: Transfer) -> str:
        """Advance `transfer`'s state (PROC, DONE or ERR); its handle is released once done."""
        if transfer.state == "PROC":
            transfer.state = self._agent.check_xfer_state(transfer.handle)
            self._settle(transfer)
        return transfer.state

    def _settle(self, transfer: Transfer) -> None:
        if transfer.state != "PROC":
            self._agent.release_xfer_handle(transfer.handle)

    def progress(self) -> None:
        """Let the agent's worker make progress (a rank written into that has nothing else
        to poll); notifications arriving here are dropped (only rank 0 receives them)."""
        self._agent.get_new_notifs()

    def notify(self, remote: str, message: bytes) -> None:
        self._agent.send_notif(remote, message)

    def notifications(self) -> list[tuple[str, bytes]]:
        """Notifications received since the last call, as (sender, message)."""
        return [
            (sender, message)
            for sender, messages in self._agent.get_new_notifs().items()
            for message in messages
        ]
