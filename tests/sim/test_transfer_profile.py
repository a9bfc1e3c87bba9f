"""The KV-link profile: the fit recovers known constants from writes they generate, the
file round-trips, and `--transfer-profile` changes what the simulator predicts."""

from __future__ import annotations

import argparse
import dataclasses
import json

import numpy as np
import pytest

from tandem.sim.args import add_common_arguments, model_and_device
from tandem.sim.cluster import Cluster, ClusterConfig
from tandem.sim.transfer_profile import (
    TransferPoint,
    TransferProfile,
    fit_transfer,
    load_transfer_profile,
)
from tandem.sim.workload import synthetic

KNOWN = TransferProfile(4.5e9, 30e-6, 2e-6, "known")
BLOCK = 64 << 10  # the small model's block (float32, 16 tokens), as the bench ran


def writes(noise: float = 0.0) -> list[TransferPoint]:
    """What the bench measures: runs of 1-512 blocks, contiguous and scattered, with a
    deterministic multiplicative noise of up to `noise`."""
    rng = np.random.default_rng(0)
    points = []
    for n in (1, 4, 16, 64, 128, 512):
        for descs in {1, n}:
            t = KNOWN.predict(descs, n * BLOCK) * (1 + rng.uniform(-noise, noise))
            points.append(TransferPoint(n, descs, n * BLOCK, t))
    return points


def constants(p: TransferProfile) -> np.ndarray:
    return np.array([p.kv_link_bandwidth, p.kv_transfer_latency_s, p.kv_descriptor_s])


def test_the_fit_recovers_the_constants_that_made_the_points():
    exact = fit_transfer(writes(), "synthetic")
    np.testing.assert_allclose(constants(exact), constants(KNOWN), rtol=1e-6)
    assert exact.median_rel_error < 1e-9
    noisy = fit_transfer(writes(noise=0.01), "synthetic")
    # 1% noise on each point: each constant within a few percent of the truth
    np.testing.assert_allclose(constants(noisy), constants(KNOWN), rtol=0.1)
    assert noisy.median_rel_error < 0.02


def test_contiguous_writes_alone_cannot_separate_latency_from_descriptors():
    contiguous = [p for p in writes() if p.num_descriptors == 1]
    fit = fit_transfer(contiguous, "contiguous only")
    # what it can know: the cost of a write of one descriptor, and the bandwidth
    assert fit.kv_transfer_latency_s + fit.kv_descriptor_s == pytest.approx(32e-6, rel=1e-6)
    assert fit.kv_link_bandwidth == pytest.approx(KNOWN.kv_link_bandwidth, rel=1e-6)


def test_too_few_points_and_bad_files_are_refused(tmp_path):
    with pytest.raises(ValueError, match="at least 3"):
        fit_transfer(writes()[:2], "x")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"kv_link_bandwidth": 1e9}))
    with pytest.raises(ValueError, match="not a transfer profile"):
        load_transfer_profile(bad)
    with pytest.raises(ValueError, match="not a transfer profile"):
        load_transfer_profile(tmp_path / "missing.json")


def test_the_file_round_trips(tmp_path):
    fit = fit_transfer(writes(noise=0.01), "synthetic")
    fit.save(tmp_path / "t.json")
    assert load_transfer_profile(tmp_path / "t.json") == fit


def test_the_simulator_reads_a_profile_file(tmp_path):
    slow = dataclasses.replace(KNOWN, kv_link_bandwidth=2e8, source="a slow link")
    slow.save(tmp_path / "slow.json")
    parser = argparse.ArgumentParser()
    add_common_arguments(parser)
    shape, default = model_and_device(parser.parse_args([]))
    _, profile = model_and_device(
        parser.parse_args(["--transfer-profile", str(tmp_path / "slow.json")])
    )
    assert profile.kv_link_bandwidth == 2e8 and profile.kv_descriptor_s == 2e-6
    assert "a slow link" in profile.source and profile.peak_flops == default.peak_flops
    requests = synthetic(20, 2.0, (1000, 2000), (2, 4), shape.vocab_size)
    ttft = []
    for p in (default, profile):
        records = Cluster(ClusterConfig(num_prefill=1, num_decode=1), shape, p).run(requests)
        ttft.append(sum(r.first_token_s - r.arrival_s for r in records))
    assert ttft[1] > ttft[0]  # the same writes take longer over the slow link
    with pytest.raises(SystemExit, match="not a transfer profile"):
        model_and_device(parser.parse_args(["--transfer-profile", str(tmp_path / "none.json")]))


def test_the_shipped_cpu_link_is_the_fitted_profile():
    """The cpu device profile's KV-link constants are the shipped transfer profile's."""
    from tandem.sim.profiles import PROFILE_DIR, load_profile

    shipped = load_transfer_profile(PROFILE_DIR / "transfer" / "cpu.json")
    cpu = load_profile("cpu")
    assert constants(shipped).tolist() == [
        cpu.kv_link_bandwidth,
        cpu.kv_transfer_latency_s,
        cpu.kv_descriptor_s,
    ]
    assert "bench/transfer.py" in shipped.source and len(shipped.points) >= 3
