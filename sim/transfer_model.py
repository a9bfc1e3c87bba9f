"""Stand-in for NIXL: how long one KV write of a run of blocks takes, and its bytes.

A write carries one descriptor per run of adjacent blocks (design §4); its time is the
profile's per-write latency, a per-descriptor cost, and its bytes over the link. With
tensor parallelism every prefill rank ships its own heads over its own link, in parallel, to
the decode ranks that hold them (design §4, "whatever the two TP sizes"): a prefill rank
feeding `tp_decode / tp_prefill` decode ranks posts one write to each, so it pays the
latency and descriptors once per destination rank. Only the sender's link is a queue:
when `tp_prefill > tp_decode` the decode rank's ingress, shared by several senders, is not
modelled. Descriptors follow the engine (engine/transfer/kv_heads.py): at equal TP sizes one per run
of adjacent blocks, as at TP 1; between different sizes one per block and destination rank
(a re-packed piece never merges across blocks). The re-packing copies themselves (on the
side with more heads a rank, at device memory bandwidth) are not modelled.
"""

from __future__ import annotations

from collections.abc import Sequence

from tandem.sim.profiles import DeviceProfile
from tandem.sim.shapes import ModelShape


def num_runs(src_ids: Sequence[int], dst_ids: Sequence[int]) -> int:
    """Descriptors of a write: maximal runs adjacent on both sides."""
    runs = 0
    for i in range(len(src_ids)):
        if i == 0 or src_ids[i] != src_ids[i - 1] + 1 or dst_ids[i] != dst_ids[i - 1] + 1:
            runs += 1
    return runs


class TransferModel:
    def __init__(
        self,
        shape: ModelShape,
        profile: DeviceProfile,
        block_size: int,
        tp: int = 1,
        tp_decode: int | None = None,
    ) -> None:
        """`tp`: the prefill node's ranks; `tp_decode`: the decode node's (default: `tp`)."""
        self.profile = profile
        self.block_bytes = shape.kv_bytes_per_token(profile.dtype_bytes) * block_size
        self.tp = tp
        self.fan_out = max(1, (tp_decode or tp) // tp)  # decode ranks per prefill rank
        self.repacked = (tp_decode or tp) != tp  # pieces: a descriptor per block

    def write_time(self, num_blocks: int, num_descriptors: int) -> float:
        p = self.profile
        data = num_blocks * self.block_bytes / self.tp
        descriptors = num_blocks if self.repacked else num_descriptors
        per_write = p.kv_transfer_latency_s + descriptors * p.kv_descriptor_s
        return self.fan_out * per_write + data / p.kv_link_bandwidth
