"""`tandem plan`: candidates in order of cost, the cheapest that meets the SLOs, and an
`LLMDeployment` the operator accepts."""

from __future__ import annotations

import subprocess
import sys

import yaml

from tandem.operator.spec import parse
from tandem.sim.cluster import ClusterConfig
from tandem.sim.plan import Candidate, SearchSpace, candidates, deployment_yaml
from tandem.sim.plan_cli import operator_refusal
from tests.bounds import PROCESS_S


def test_candidates_of_a_device_count_cover_tp_splits_and_thresholds():
    space = SearchSpace(tp_sizes=(1, 2), thresholds=(0, 512))
    found = list(candidates(ClusterConfig(), space, 4))
    assert all(c.num_devices == 4 for c in found)
    assert len(set(found)) == len(found)
    # aggregated: 4x TP1, 2x TP2; disaggregated (prefill TP, decode TP): (1, 1) 1-3 prefill
    # nodes, (1, 2) 2P+1D, (2, 1) 1P+2D, (2, 2) 1P+1D; each with 2 thresholds
    assert len(found) == 2 + (3 + 1 + 1 + 1) * 2
    assert ClusterConfig(num_prefill=0, num_decode=4) in found
    mixed = ClusterConfig(num_prefill=2, num_decode=1, tp_prefill=1, tp_decode=2)
    assert mixed in found
    assert not list(candidates(ClusterConfig(), SearchSpace(tp_sizes=(2,)), 3))
    narrow = SearchSpace(tp_sizes=(1, 2), thresholds=(0,), tp_prefill=(1,), tp_decode=(2,))
    found = list(candidates(ClusterConfig(), narrow, 4))
    assert found == [
        ClusterConfig(num_prefill=0, num_decode=2, tp_decode=2),
        ClusterConfig(num_prefill=2, num_decode=1, tp_prefill=1, tp_decode=2),
    ]


def test_a_mixed_tp_layout_becomes_an_llmdeployment_with_per_pool_tp():
    config = ClusterConfig(
        num_prefill=2, num_decode=1, tp_prefill=1, tp_decode=2, remote_prefill_threshold=512
    )
    text = deployment_yaml(Candidate(config, {}), "llama-3-8b", "kv-aware")
    spec = yaml.safe_load(text)["spec"]
    assert spec["prefill"]["tensorParallelSize"] == 1
    assert spec["prefill"]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert spec["decode"]["tensorParallelSize"] == 2
    assert spec["decode"]["resources"]["limits"]["nvidia.com/gpu"] == 2
    refusal = operator_refusal(text)
    if refusal is None:  # the operator serves TP above 1 beside prefill pods
        parsed = parse(yaml.safe_load(text))
        assert (parsed.prefill.tensor_parallel_size, parsed.decode.tensor_parallel_size) == (1, 2)
    else:  # the one rule being lifted; anything else in the YAML would be another message
        assert "tensorParallelSize above 1" in refusal
        tp1 = ClusterConfig(num_prefill=2, num_decode=2, remote_prefill_threshold=512)
        assert (
            operator_refusal(deployment_yaml(Candidate(tp1, {}), "llama-3-8b", "kv-aware")) is None
        )


def plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-P", "-m", "tandem.engine.cli", "plan", *args],
        capture_output=True,
        text=True,
        timeout=PROCESS_S,
    )


WORKLOAD = (
    "--num-requests", "40", "--prompt-tokens", "1000,4000", "--output-tokens", "20,80",
    "--tp", "1", "--thresholds", "0", "--max-devices", "6", "--slo-tpot", "0.05",
)  # fmt: skip


def test_plan_needs_more_devices_for_more_load_and_prints_a_valid_deployment(tmp_path):
    light = plan(*WORKLOAD, "--target-rate", "1", "--slo-ttft", "0.5")
    heavy = plan(
        *WORKLOAD, "--target-rate", "40", "--slo-ttft", "0.5", "--yaml", str(tmp_path / "d.yaml")
    )
    assert light.returncode == 0 and heavy.returncode == 0, light.stderr + heavy.stderr
    devices = []
    for out in (light.stdout, heavy.stdout):
        line = next(x for x in out.splitlines() if x.startswith("cheapest: "))
        assert "meets the SLOs" in line
        devices.append(int(line.split()[1]))
    assert devices[1] > devices[0]
    llmd = yaml.safe_load((tmp_path / "d.yaml").read_text())
    spec = parse(llmd)  # the operator's own reading of the custom resource
    assert (
        spec.prefill.replicas * spec.prefill.tensor_parallel_size
        + (spec.decode.replicas * spec.decode.tensor_parallel_size)
        == devices[1]
    )


def test_plan_says_when_nothing_meets_the_slos():
    result = plan(*WORKLOAD, "--target-rate", "5", "--slo-ttft", "0.0001", "--max-devices", "2")
    assert result.returncode != 0
    assert "no deployment of up to 2 h100 devices meets the SLOs" in result.stderr
