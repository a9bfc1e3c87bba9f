"""`tandem plan`: candidates in order of cost, the cheapest that meets the SLOs, and an
`LLMDeployment` the operator accepts."""

from __future__ import annotations

import yaml

from tandem.operator.spec import parse
from tandem.sim.cluster import ClusterConfig
from tandem.sim.plan import Candidate, SearchSpace, candidates, deployment_yaml


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
    tp1 = ClusterConfig(num_prefill=2, num_decode=2, remote_prefill_threshold=512)
    # the operator's own parser takes every layout the planner emits
    for layout in (config, tp1, ClusterConfig(num_prefill=0, num_decode=2, tp_decode=2)):
        body = yaml.safe_load(deployment_yaml(Candidate(layout, {}), "llama-3-8b", "kv-aware"))
        parsed = parse(body)
        tp = (parsed.prefill.tensor_parallel_size, parsed.decode.tensor_parallel_size)
        assert tp == (layout.tp_prefill, layout.tp_decode)
