"""KV-block transfer between nodes: the messages, descriptor runs, and the NIXL agent.

A prefill node pushes finished KV blocks straight into blocks a decode node reserved: one
NIXL WRITE descriptor per run of blocks adjacent on both sides (a block holds every layer's
K and V, so a run is one contiguous region at each end). The decode node's agent metadata
and KV layout travel inside every prefill request (a few hundred bytes), so a restarted
prefill node needs only the pairing (`engine.api.wire`) again, and an agent name carries a boot
id, so a restarted node is a new agent that nobody mistakes for the dead one.

Control messages are msgspec structs, msgpack on the wire: on a new connection the decode
node first greets (`engine.api.wire.Hello`, answered `Welcome` or `PairingRefused`); then
`PrefillRequest` and `AbortPrefill` go decode -> prefill over ZMQ DEALER/ROUTER;
`PrefillFailed` and `AbortAck` come back on the same socket; `PrefillDone` is a NIXL
notification, sent once every write of the request has completed, so it always arrives
after the data.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass

import msgspec
import torch

from tandem.engine.api.wire import Hello, PairingRefused, Welcome
from tandem.engine.core.request import TokenLogprobs
from tandem.engine.core.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

# A prefill worker with a step due whose finished job still has a write in flight keeps
# polling that write before the step, for at most this share of its last step: the job's
# `PrefillDone` then goes out when the write lands instead of a whole step later (nothing
# polls during a step), and a slow or stuck write delays the queue by a quarter of a step
# at most. `PrefillNode` does it, and the simulator's prefill workers model it.
LAST_WRITE_WAIT_SHARE = 0.25

# Remote agents a prefill rank keeps loaded; the least recently used is dropped beyond this
# (agents, not nodes: a decode node of N ranks counts N on the rank writing to all of them).
MAX_REMOTE_AGENTS = 1024


class KVLayout(msgspec.Struct, frozen=True):
    """Where one rank's block-major KV tensor lives: block `i` is the `block_bytes` bytes at
    `base_addr + i * block_bytes`, over KV heads `kv_head_start` ..
    `kv_head_start + num_kv_heads` of the model's `total_kv_heads`."""

    base_addr: int
    block_bytes: int
    num_blocks: int
    device_id: int
    mem_type: str  # "DRAM" or "VRAM"
    kv_head_start: int = 0
    num_kv_heads: int = 1
    total_kv_heads: int = 1


class AgentInfo(msgspec.Struct, frozen=True):
    """One rank's NIXL agent: its name, its metadata for `add_remote_agent`, its cache."""

    name: str
    metadata: bytes
    layout: KVLayout


class WireLogprobs(msgspec.Struct, frozen=True):
    token_id: int
    logprob: float
    rank: int
    top: list[tuple[int, float]]


class PrefillRequest(msgspec.Struct, frozen=True, tag="prefill"):
    """Compute the prompt's KV and write blocks `skip_blocks:` into `dst_block_ids`.

    `sampling` is the request's, with its effective seed, for the first token; the prefill
    node never starts a write later than `deadline_s` after receiving this.
    """

    request_id: str
    attempt: int
    token_ids: list[int]
    sampling: SamplingParams
    skip_blocks: int
    dst_block_ids: list[int]
    agent: AgentInfo  # rank 0's: it receives `PrefillDone`
    deadline_s: float
    sent_at: float  # wall clock: a message older than its deadline is refused
    cache_salt: str | None = None
    log_id: str | None = None  # the client's request id, for log lines (engine.request_log)
    trace: dict[str, str] | None = None  # W3C trace context of the decode node's span
    rank_agents: list[AgentInfo] = []  # ranks 1..N-1 of a tensor-parallel decode node


class AbortPrefill(msgspec.Struct, frozen=True, tag="abort"):
    """End the attempt `request_id@attempt` of the decode node whose agent (rank 0's, as in
    its `PrefillRequest`) is `agent`: another decode node may have the same attempt."""

    request_id: str
    attempt: int
    agent: str


class PrefillDone(msgspec.Struct, frozen=True, tag="done"):
    """The notification: every block is written, and the first token sampled."""

    request_id: str
    attempt: int
    token_id: int
    logprobs: WireLogprobs | None
    num_blocks: int
    num_bytes: int
    transfer_s: float
    prefill_s: float
    # each prefill rank's (first KV head, count): the decode node re-packs blocks whose
    # heads came from several ranks (engine.kv_heads)
    src_heads: list[tuple[int, int]] = []


class PrefillFailed(msgspec.Struct, frozen=True, tag="failed"):
    request_id: str
    attempt: int
    reason: str


class AbortAck(msgspec.Struct, frozen=True, tag="abort_ack"):
    """No write of this attempt is in flight or will start: its blocks may be reused."""

    request_id: str
    attempt: int


def to_wire(lp: TokenLogprobs | None) -> WireLogprobs | None:
    if lp is None:
        return None
    return WireLogprobs(lp.token_id, lp.logprob, lp.rank, list(lp.top))


def from_wire(lp: WireLogprobs | None) -> TokenLogprobs | None:
    if lp is None:
        return None
    return TokenLogprobs(lp.token_id, lp.logprob, lp.rank, tuple((t, v) for t, v in lp.top))


ToPrefill = PrefillRequest | AbortPrefill | Hello
FromPrefill = PrefillFailed | AbortAck | Welcome | PairingRefused

_encoder = msgspec.msgpack.Encoder()
_to_prefill = msgspec.msgpack.Decoder(ToPrefill)
_from_prefill = msgspec.msgpack.Decoder(FromPrefill)
_done = msgspec.msgpack.Decoder(PrefillDone)


def encode(message: msgspec.Struct) -> bytes:
    return _encoder.encode(message)


def decode_to_prefill(data: bytes) -> ToPrefill:
    return _to_prefill.decode(data)


def decode_from_prefill(data: bytes) -> FromPrefill:
    return _from_prefill.decode(data)


def decode_done(data: bytes) -> PrefillDone:
    return _done.decode(data)


def block_runs(src_ids: list[int], dst_ids: list[int]) -> list[tuple[int, int, int]]:
    """Maximal runs `(src_start, dst_start, length)` of blocks adjacent on both sides, in
    order. Raises ValueError when the lists differ in length."""
    if len(src_ids) != len(dst_ids):
        raise ValueError(f"{len(src_ids)} source blocks but {len(dst_ids)} destinations")
    runs: list[tuple[int, int, int]] = []
    for src, dst in zip(src_ids, dst_ids, strict=True):
        if runs:
            s0, d0, n = runs[-1]
            if src == s0 + n and dst == d0 + n:
                runs[-1] = (s0, d0, n + 1)
                continue
        runs.append((src, dst, 1))
    return runs


def run_descs(
    layout: KVLayout, runs: list[tuple[int, int, int]], side: int
) -> list[tuple[int, int, int]]:
    """NIXL transfer descriptors `(addr, length, device)` for one side of `runs` (side 0:
    source, 1: destination)."""
    return [
        (
            layout.base_addr + run[side] * layout.block_bytes,
            run[2] * layout.block_bytes,
            layout.device_id,
        )
        for run in runs
    ]


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
