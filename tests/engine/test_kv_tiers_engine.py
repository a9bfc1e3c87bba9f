"""The KV tiers in a real engine: the real `TierCopier` moving a small random model's blocks
between the CPU KV cache, a second pool in memory and a file on disk. Multi-turn
conversations over a device pool smaller than their working set give the same greedy
tokens with tiers as without, while the turns' prefixes come back from the tiers."""

from __future__ import annotations

import math

import pytest
import torch

from tandem.engine.core.sampling_params import SamplingParams
from tandem.engine.core.tier_ops import DEVICE, DISK, HOST, TierCopy
from tandem.engine.engine_args import EngineArgs
from tandem.engine.exec.model_shard import kv_block_bytes
from tandem.engine.exec.tier_copier import DISK_FILE, TierCopier
from tandem.engine.llm_engine import LLMEngine

BLOCK_SIZE = 4
DEVICE_BLOCKS = 24  # a conversation's last turn needs 9 of them; four do not fit


def engine(model_dir, tmp_path, host_blocks: int = 0, disk_blocks: int = 0) -> LLMEngine:
    probe = EngineArgs(str(model_dir), dtype="float32", block_size=BLOCK_SIZE, num_kv_blocks=1)
    block_gib = kv_block_bytes(probe.create_config()) / 2**30
    args = EngineArgs(
        str(model_dir), dtype="float32", block_size=BLOCK_SIZE, num_kv_blocks=DEVICE_BLOCKS,
        max_model_len=128, kv_host_gib=host_blocks * block_gib, kv_disk_gib=disk_blocks * block_gib,
        kv_disk_dir=str(tmp_path / "disk") if disk_blocks else None,
    )  # fmt: skip
    return LLMEngine(args.create_config())


def conversations(e: LLMEngine, turns: int = 3) -> dict[str, list[int]]:
    """Four conversations, a turn of each in turn, each turn one request run to its end."""
    out = {}
    for turn in range(turns):
        for c in range(4):
            rid = f"c{c}t{turn}"
            prompt = [(c * 97 + i) % 200 + 1 for i in range(12 * turn + 13)]
            e.add_request(rid, prompt, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
            while e.has_unfinished_requests():
                for o in e.step():
                    out[rid] = o.outputs[0].token_ids
    return out


def settle(e: LLMEngine) -> None:
    """Wait for the copies in flight, applying them (a state, not a time)."""
    tiers = e.kv.tiers
    while tiers is not None and tiers.in_flight:
        e.scheduler.schedule()
        tiers.transport._thread.join(0.001)


@pytest.fixture(scope="module")
def without_tiers(llama_dir, tmp_path_factory):
    e = engine(llama_dir, tmp_path_factory.mktemp("none"))
    try:
        out = conversations(e)
        assert e.kv.stats.hits < 4 * (12 + 24) // 2  # the pool is too small to keep them
        return out
    finally:
        e.shutdown()


@pytest.mark.parametrize(("host", "disk"), [(64, 0), (12, 64)])
def test_conversations_give_the_same_tokens_with_tiers_and_hit_them(
    llama_dir, tmp_path, without_tiers, host, disk
):
    e = engine(llama_dir, tmp_path, host, disk)
    try:
        assert conversations(e) == without_tiers
        settle(e)
        hits = e.kv.stats.tier_hits
        # every later turn found its earlier turn's full blocks, most of them below
        assert sum(hits.values()) == 4 * (12 + 24), hits
        assert hits[HOST] + hits[DISK] > hits[DEVICE], hits
        if disk:
            assert hits[DISK] > 0 and e.kv.tiers.moved[(DISK, "down")] > 0
        counts = e.check_integrity()
        assert counts.in_use == 0 and not e.kv.tiers.held_blocks()
        assert e.kv.tiers.failed_copies == 0
    finally:
        e.shutdown()


def test_the_disk_tier_reserves_its_file_and_round_trips_blocks(tmp_path):
    kv = torch.randn(6, 2, 2, 4, 2, 8)  # [blocks, layers, K/V, block_size, heads, D]
    copier = TierCopier(kv, host_blocks=2, disk_blocks=3, disk_dir=str(tmp_path))
    try:
        path = tmp_path / DISK_FILE
        assert path.stat().st_blocks * 512 >= 3 * math.prod(kv.shape[1:]) * 4  # allocated
        original = kv.clone()
        copies = [
            TierCopy(0, DEVICE, HOST, (4, 1), (0, 1)),
            TierCopy(1, HOST, DISK, (0, 1), (2, 0)),
            TierCopy(2, DEVICE, HOST, (0, 0), (0, 1)),  # the host slots reused
            TierCopy(3, DISK, DEVICE, (2, 0), (0, 5)),
        ]
        for copy in copies:
            copier.submit(copy)
        done = []
        while len(done) < len(copies):
            done += copier.poll()
            copier._thread.join(0.001)
        assert done == [(i, True) for i in range(4)]
        assert torch.equal(kv[0], original[4]) and torch.equal(kv[5], original[1])
    finally:
        copier.close()


def test_a_disk_tier_folder_serves_one_process_at_a_time(tmp_path):
    kv = torch.zeros(2, 1, 2, 4, 1, 8)
    first = TierCopier(kv, host_blocks=1, disk_blocks=1, disk_dir=str(tmp_path))
    try:
        with pytest.raises(ValueError, match="another process"):
            TierCopier(kv, host_blocks=1, disk_blocks=1, disk_dir=str(tmp_path))
    finally:
        first.close()
    TierCopier(kv, host_blocks=1, disk_blocks=1, disk_dir=str(tmp_path)).close()


def test_a_copy_that_fails_is_reported_and_the_next_ones_still_run(tmp_path):
    kv = torch.randn(4, 1, 2, 4, 1, 8)
    copier = TierCopier(kv, host_blocks=2)
    try:
        copier.submit(TierCopy(0, DEVICE, HOST, (0,), (7,)))  # no host slot 7
        copier.submit(TierCopy(1, DEVICE, HOST, (1,), (1,)))
        done = []
        while len(done) < 2:
            done += copier.poll()
            copier._thread.join(0.001)
        assert done == [(0, False), (1, True)] and copier.failed is not None
        assert torch.equal(copier.tensors[HOST][1], kv[1])
    finally:
        copier.close()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"kv_disk_gib": 0.01, "kv_disk_dir": "/tmp/x"}, "sits under a host tier"),
        ({"kv_host_gib": 0.01, "kv_disk_gib": 0.01}, "needs a folder"),
        ({"kv_host_gib": -1.0}, "at least 0"),
        ({"kv_host_gib": float("nan")}, "at least 0"),
        ({"kv_host_gib": 1e-12}, "holds no block"),
        ({"kv_host_gib": 0.01, "tensor_parallel_size": 2}, "tensor_parallel_size 1"),
    ],
)
def test_bad_tier_sizes_are_refused_with_the_reason(llama_dir, changes, message):
    args = EngineArgs(str(llama_dir), dtype="float32", num_kv_blocks=16, **changes)
    with pytest.raises(ValueError, match=message):
        args.create_config()
