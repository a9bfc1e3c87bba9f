"""The messages between decode and prefill nodes: msgspec structs, msgpack on the wire.

On a new connection the decode node first greets (`engine.api.wire.Hello`, answered
`Welcome` or `PairingRefused`); then `PrefillRequest` and `AbortPrefill` go decode -> prefill
over ZMQ DEALER/ROUTER; `PrefillFailed` and `AbortAck` come back on the same socket;
`PrefillDone` is a NIXL notification, sent once every write of the request has completed, so
it always arrives after the data. The decode node's agent metadata and KV layout
(`AgentInfo`, `KVLayout`) travel inside every prefill request (a few hundred bytes), so a
restarted prefill node needs only the pairing again.
"""

from __future__ import annotations

import msgspec

from tandem.engine.api.wire import Hello, PairingRefused, Welcome
from tandem.engine.core.request import TokenLogprobs
from tandem.engine.core.sampling_params import SamplingParams


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
    # prompt tokens the prefill node found cached (in any of its KV tiers), for `usage`
    num_cached_tokens: int = 0


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
