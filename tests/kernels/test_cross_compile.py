"""Every Triton kernel compiles for the H100/H200 (sm_90) for real, on this CPU-only machine,
with no register spills and within the GPU's limits, at the shapes the engine uses.

The interpreter tests check what the kernels compute; this checks that ptxas accepts them
and what they would cost a multiprocessor, which the interpreter never sees.
"""

from __future__ import annotations

import json

import pytest

from tandem.kernels.cross_compile import CUDA_ARCHS, KernelBuild, cross_compile
from tests.bench_run import run_bench

KERNELS = {
    "_unified_attention_kernel",
    "_merge_splits_kernel",
    "_write_kv_kernel",
    "_rms_norm_kernel",
    "_rotary_kernel",
    "_silu_and_mul_kernel",
}


@pytest.fixture(scope="module")
def sm90_builds(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("builds") / "sm90.json"
    # Compiled, not interpreted: the kernel modules must be imported without TRITON_INTERPRET.
    # The environment asks for no FP fusion: only a launch that passes its options says yes.
    env = {"TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "0"}
    run_bench("kernel_resources.py", "--arch", "90", "--json", str(out), env=env)
    return json.loads(out.read_text())


def test_every_kernel_compiles_without_spills_within_limits(sm90_builds):
    assert {b["name"] for b in sm90_builds} == KERNELS
    limit = CUDA_ARCHS[90].shared_per_block
    for b in sm90_builds:
        where = f"{b['case']}: {b['name']}"
        assert b["stack_bytes"] == 0 and b["local_bytes"] == 0, f"{where} spills"
        assert 0 < b["registers"] <= 255, where
        assert b["shared_bytes"] <= limit, where
        assert b["num_warps"] * 32 <= b["max_threads"], f"{where}: too many registers"


def test_every_launch_pins_fp_fusion(sm90_builds):
    """Each launcher passes `LAUNCH_OPTIONS`, so neither the environment nor Triton's next
    default (it changes in 3.10) decides whether our kernels use FMAs."""
    unpinned = {b["name"] for b in sm90_builds if not b["fp_fusion"]}
    assert not unpinned, f"launched without LAUNCH_OPTIONS: {sorted(unpinned)}"


def test_attention_launch_geometry(sm90_builds):
    """Grids follow the plan: one program per query tile and KV head, splits only where few
    programs face a long context, and fp32 on narrow tiles."""
    attention = {b["case"]: b for b in sm90_builds if b["name"] == "_unified_attention_kernel"}
    assert attention["attention: decode, 64 seqs at 2k"]["grid"] == [64, 8, 1]
    assert attention["attention: decode, 1 seq at 32k (split-KV)"]["grid"] == [1, 8, 16]
    assert attention["attention: prefill, fp32 (IEEE dot)"]["grid"] == [128, 8, 1]  # 16 rows
    merges = [b for b in sm90_builds if b["name"] == "_merge_splits_kernel"]
    assert {b["case"] for b in merges} >= {"attention: decode, 1 seq at 32k (split-KV)"}


def test_occupancy_follows_the_cuda_rules():
    # 124 registers: 3,968 per warp, allocated as 4,096, so 16 warps fit the 64K registers.
    decode = KernelBuild("k", 90, (1, 1, 1), 4, 3, 124, 0, 0, 39_424, True)
    assert decode.max_threads == 512
    assert decode.blocks_per_sm() == 4  # by registers; shared memory would allow 5
    # 255 registers: 8 warps by registers; 80.5 KiB of shared memory: 2 blocks of 228 KiB.
    prefill = KernelBuild("k", 90, (1, 1, 1), 4, 3, 255, 0, 0, 82_432, True)
    assert prefill.max_threads == 256
    assert prefill.blocks_per_sm() == 2
    assert not prefill.spilled and KernelBuild("k", 80, (1, 1, 1), 4, 3, 32, 8, 0, 0, True).spilled


def test_cross_compile_refuses_interpreted_kernels_and_unknown_targets(monkeypatch):
    with pytest.raises(ValueError, match="unknown CUDA architecture 75"), cross_compile(75):
        pass
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # Triton reads it when asked
    with pytest.raises(RuntimeError, match="unset TRITON_INTERPRET"), cross_compile(90):
        pass
