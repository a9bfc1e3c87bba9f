"""Staging mirrors planned with the KV cache: which splits of its heads a writer's rank
needs for the peers' tensor-parallel sizes it is told, and the memory plan that leaves room
for them (fewer blocks), so that no write allocates one."""

from __future__ import annotations

import pytest

from tandem.engine import engine_args
from tandem.engine.engine_args import EngineArgs, check_kv_cache_fits
from tandem.engine.exec.model_shard import kv_block_bytes
from tandem.engine.transfer.kv_staging import num_staging_mirrors, plan_block_bytes, staging_cuts


@pytest.mark.parametrize(
    ("num_heads", "size", "peers", "cuts"),
    [
        (8, 1, (), [[]]),  # equal sizes: no mirror
        (8, 1, (1,), [[]]),
        (8, 1, (2,), [[((0, 4), (4, 4))]]),
        (8, 1, (2, 4), [[((0, 4), (4, 4)), ((0, 2), (2, 2), (4, 2), (6, 2))]]),
        (8, 2, (1,), [[], []]),  # a coarser peer takes each rank's heads whole
        (8, 2, (4,), [[((0, 2), (2, 2))], [((0, 2), (2, 2))]]),
        (2, 2, (4,), [[], []]),  # replicated on the peer: still one head a rank
        (2, 1, (2, 4), [[((0, 1), (1, 1))]]),  # both peers split the same way: one mirror
    ],
)
def test_a_rank_plans_one_mirror_per_split_its_peers_need(num_heads, size, peers, cuts):
    assert [staging_cuts(num_heads, size, rank, peers) for rank in range(size)] == cuts


def test_the_plan_leaves_room_for_the_mirrors(llama_dir, monkeypatch):
    """On the CPU the cache gets a fixed budget; with a peer of twice our size a block costs
    its slot in the mirror too, so half as many blocks are planned."""
    args = {"model": str(llama_dir), "max_num_seqs": 256, "max_model_len": 2048}
    equal = EngineArgs(**args).create_config()
    budget = 64 * kv_block_bytes(equal)
    monkeypatch.setattr(engine_args, "_CPU_KV_CACHE_BYTES", budget)
    equal = EngineArgs(**args).create_config()
    finer = EngineArgs(**args, peer_tensor_parallel_sizes=(2,)).create_config()
    assert num_staging_mirrors(equal) == 0 and num_staging_mirrors(finer) == 1
    assert plan_block_bytes(finer) == 2 * kv_block_bytes(finer)
    assert (equal.cache.num_blocks, finer.cache.num_blocks) == (64, 32)


def test_an_explicit_block_count_must_fit_with_its_mirrors(llama_dir, monkeypatch):
    config = EngineArgs(
        model=str(llama_dir), num_kv_blocks=8, peer_tensor_parallel_sizes=(2,)
    ).create_config()
    memory = 8 * kv_block_bytes(config)  # the cache alone fits, not with its mirror
    monkeypatch.setattr(engine_args, "device_memory_bytes", lambda device: memory)
    with pytest.raises(ValueError, match="does not fit"):
        check_kv_cache_fits(config, 8)


def test_a_peer_size_that_cannot_split_the_model_is_refused(llama_dir):
    args = EngineArgs(model=str(llama_dir), num_kv_blocks=8, peer_tensor_parallel_sizes=(3,))
    with pytest.raises(ValueError, match="tensor_parallel_size 3"):
        args.create_config()
