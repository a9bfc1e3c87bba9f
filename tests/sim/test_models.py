"""The step-time and transfer stand-ins: the direction of every dependency, and profiles."""

from __future__ import annotations

import dataclasses

import pytest

from tandem.sim.profiles import DeviceProfile, load_profile
from tandem.sim.shapes import SHAPES, load_shape
from tandem.sim.step_model import StepShape, StepTimeModel
from tandem.sim.transfer_model import TransferModel, num_runs

LLAMA_8B = SHAPES["llama-3-8b"]


def test_shipped_shapes_have_their_published_parameter_counts():
    assert 7.9e9 < LLAMA_8B.num_params < 8.1e9  # "8B": 8.03e9
    assert 70.0e9 < SHAPES["llama-3-70b"].num_params < 71.0e9  # "70B": 70.6e9


def test_a_model_folder_gives_its_shape(llama_dir):
    shape = load_shape(str(llama_dir))
    assert shape.num_layers >= 1 and shape.vocab_size > 0
    with pytest.raises(ValueError, match="unknown model"):
        load_shape("no-such-model")


def test_decode_is_memory_bound_and_prefill_compute_bound_on_an_h100():
    model = StepTimeModel(LLAMA_8B, load_profile("h100"))
    decode = model.step_time(StepShape.of([1] * 8, [1000] * 8, 8))
    longer = model.step_time(StepShape.of([1] * 8, [4000] * 8, 8))
    prefill = model.step_time(StepShape.of([2048], [2048], 1))
    assert longer > decode  # more KV to read
    # 8 decode tokens cost about a weight read; 2048 prompt tokens cost far more
    weights_s = LLAMA_8B.num_params * 2 / (3.35e12 * 0.8)
    assert decode == pytest.approx(weights_s, rel=0.5)
    assert prefill > 5 * decode


def test_tensor_parallelism_shortens_a_step_and_more_gpus_hold_more_blocks():
    h100 = load_profile("h100")
    step = StepShape.of([512] * 4, [512] * 4, 4)
    one, two = StepTimeModel(LLAMA_8B, h100, 1), StepTimeModel(LLAMA_8B, h100, 2)
    assert two.step_time(step) < one.step_time(step)
    assert two.kv_blocks_per_device(16) > 2 * one.kv_blocks_per_device(16)
    with pytest.raises(ValueError, match="does not fit"):
        StepTimeModel(SHAPES["llama-3-70b"], h100, 1).kv_blocks_per_device(16)


def test_a_cpu_profile_adds_compute_and_memory_times():
    h100 = load_profile("h100")
    summed = dataclasses.replace(h100, overlap=False)
    step = StepShape.of([256], [256], 1)
    a, b = StepTimeModel(LLAMA_8B, h100), StepTimeModel(LLAMA_8B, summed)
    assert b.step_time(step) > a.step_time(step)


def test_each_role_pays_its_own_work_outside_the_model():
    cpu = dataclasses.replace(
        load_profile("cpu"),
        decode_step_overhead_s=1e-3,
        decode_seq_overhead_s=2e-4,
        prefill_step_overhead_s=5e-3,
    )
    step = StepShape.of([1] * 4, [100] * 4, 4)
    bare = StepTimeModel(LLAMA_8B, cpu).step_time(step)
    decode = StepTimeModel(LLAMA_8B, cpu, role="decode").step_time(step)
    prefill = StepTimeModel(LLAMA_8B, cpu, role="prefill").step_time(step)
    assert decode - bare == pytest.approx(1e-3 + 4 * 2e-4)
    assert prefill - bare == pytest.approx(5e-3)
    with pytest.raises(ValueError, match="unknown node role"):
        StepTimeModel(LLAMA_8B, cpu, role="router")


def test_transfers_count_runs_of_adjacent_blocks_and_bytes():
    assert num_runs([1, 2, 3, 7], [10, 11, 12, 13]) == 2
    assert num_runs([1, 2, 3], [10, 12, 13]) == 2
    assert num_runs([], []) == 0
    t = TransferModel(LLAMA_8B, load_profile("h100"), block_size=16)
    assert t.block_bytes == 32 * 2 * 8 * 128 * 2 * 16  # 2 MiB, design §4's layout
    assert t.write_time(64, 8) > t.write_time(64, 1) > t.write_time(1, 1)


def test_a_transfer_between_different_tp_sizes_pays_per_destination_rank():
    h100 = load_profile("h100")
    same = TransferModel(LLAMA_8B, h100, 16, tp=2, tp_decode=2)
    one_to_two = TransferModel(LLAMA_8B, h100, 16, tp=1, tp_decode=2)
    two_to_one = TransferModel(LLAMA_8B, h100, 16, tp=2, tp_decode=1)
    per_write = h100.kv_transfer_latency_s + 3 * h100.kv_descriptor_s  # 3 runs
    per_piece = h100.kv_transfer_latency_s + 64 * h100.kv_descriptor_s  # a block each
    bytes_s = 64 * same.block_bytes / h100.kv_link_bandwidth
    # TP1 -> TP2: one rank ships every head (all the bytes on its link), in two writes of
    # a descriptor per block (re-packed pieces never merge across blocks)
    assert one_to_two.write_time(64, 3) == pytest.approx(2 * per_piece + bytes_s)
    # TP2 -> TP1: each rank ships half the bytes on its own link, one write, pieces again
    assert two_to_one.write_time(64, 3) == pytest.approx(per_piece + bytes_s / 2)
    # TP2 -> TP2: rank i -> rank i, whole blocks: runs merge as at TP 1
    assert same.write_time(64, 3) == pytest.approx(per_write + bytes_s / 2)


def test_profiles_round_trip_and_bad_ones_are_refused(tmp_path):
    h200 = load_profile("h200")
    path = tmp_path / "p.json"
    h200.save(path)
    assert load_profile(str(path)) == h200
    with pytest.raises(ValueError, match="unknown device profile"):
        load_profile("tpu")
    with pytest.raises(ValueError, match="must be in"):
        dataclasses.replace(h200, compute_efficiency=1.5)
    path.write_text('{"name": "x", "bogus": 1}')
    with pytest.raises(ValueError, match="unknown profile fields"):
        load_profile(str(path))
    assert isinstance(h200, DeviceProfile)
    assert h200.mem_bandwidth > load_profile("h100").mem_bandwidth
