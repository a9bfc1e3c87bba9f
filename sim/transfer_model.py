"""Stand-in for NIXL: how long one KV write of a run of blocks takes, and its bytes.

A write carries one descriptor per run of adjacent blocks (design §4); its time is the
profile's per-write latency, a per-descriptor cost, and its bytes over the link. With
tensor parallelism every rank ships its own heads over its own link, in parallel.
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
    def __init__(self, shape: ModelShape, profile: DeviceProfile, block_size: int, tp: int = 1):
        self.profile = profile
        self.block_bytes = shape.kv_bytes_per_token(profile.dtype_bytes) * block_size
        self.tp = tp

    def write_time(self, num_blocks: int, num_descriptors: int) -> float:
        p = self.profile
        data = num_blocks * self.block_bytes / self.tp
        return (
            p.kv_transfer_latency_s
            + num_descriptors * p.kv_descriptor_s
            + data / (p.kv_link_bandwidth)
        )
