"""NIXL descriptor maths: a prefill node pushes finished KV blocks straight into blocks a
decode node reserved, one WRITE descriptor per run of blocks adjacent on both sides (a block
holds every layer's K and V, so a run is one contiguous region at each end)."""

from __future__ import annotations

from tandem.engine.transfer.messages import KVLayout


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
