"""`tandem plan`: candidates in order of cost, the cheapest that meets the SLOs, and an
`LLMDeployment` the operator accepts; end to end from the command line."""

from __future__ import annotations

import re

import yaml

from tandem.operator.spec import parse
from tandem.sim.cluster import ClusterConfig
from tandem.sim.plan import Candidate, SearchSpace, candidates, deployment_yaml, search
from tandem.sim.profiles import load_profile
from tandem.sim.results import SLO
from tandem.sim.shapes import SHAPES
from tandem.sim.simulate import simulate
from tandem.sim.workload import synthetic
from tests.sim.test_cli import tandem

# 40 requests/s of 512-2048 prompt tokens: more prefill than one H100 serves within the
# TTFT target, so the search must go past one device.
SHAPE, H100 = SHAPES["llama-3-8b"], load_profile("h100")
TIGHT = SLO(ttft_s=0.3, tpot_s=0.05)
ONE_TP = SearchSpace(tp_sizes=(1,), thresholds=(0, 512), max_devices=4)


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


def busy_workload():
    return synthetic(60, 40.0, (512, 2048), (8, 32), SHAPE.vocab_size, seed=0)


def test_the_search_takes_the_fewest_devices_that_meet_the_slos_and_the_best_of_them():
    base = ClusterConfig(max_model_len=4096)
    best, tried = search(base, SHAPE, H100, busy_workload(), TIGHT, ONE_TP, log=lambda _: None)
    assert best is not None and best.meets
    devices = best.config.num_devices
    fewer = [c for c in tried if c.config.num_devices < devices]
    assert fewer and not any(c.meets for c in fewer)  # it had to go further, and did not skip
    assert max(c.config.num_devices for c in tried) == devices  # it stopped there
    rivals = [c for c in tried if c.config.num_devices == devices and c.meets]
    assert best.summary["goodput_rps"] == max(c.summary["goodput_rps"] for c in rivals)
    # nothing meets a target no deployment can: every device count up to the bound is tried
    none, tried = search(
        base, SHAPE, H100, busy_workload(), SLO(1e-4, 1e-4), ONE_TP, log=lambda _: None
    )
    assert none is None and max(c.config.num_devices for c in tried) == ONE_TP.max_devices


def test_a_candidate_stopped_early_is_one_the_whole_run_says_misses_the_slos():
    """The search stops a simulation once its SLOs are lost; each verdict, and the winner's
    figures, are those of the whole run."""
    base, requests = ClusterConfig(max_model_len=4096), busy_workload()
    best, tried = search(base, SHAPE, H100, requests, TIGHT, ONE_TP, log=lambda _: None)
    stopped = [c for c in tried if c.summary["stopped_early"]]
    assert stopped and best is not None and not best.summary["stopped_early"]
    for c in tried:
        whole = simulate(c.config, SHAPE, H100, requests, TIGHT)
        complete = whole["num_finished"] == whole["num_requests"]
        assert c.meets == (complete and whole["slo"]["attained"] >= ONE_TP.attainment)
        if c.summary["stopped_early"]:  # it saved simulated work
            assert c.summary["num_events"] < whole["num_events"]
        else:
            assert c.summary["goodput_rps"] == whole["goodput_rps"]


def test_a_search_over_two_processes_finds_what_one_process_finds():
    base, requests = ClusterConfig(max_model_len=4096), busy_workload()
    one = search(base, SHAPE, H100, requests, TIGHT, ONE_TP, log=lambda _: None)
    two = search(base, SHAPE, H100, requests, TIGHT, ONE_TP, log=lambda _: None, jobs=2)
    assert two[0] is not None and two[0].config == one[0].config
    assert [(c.config, c.meets) for c in two[1]] == [(c.config, c.meets) for c in one[1]]
    assert two[0].summary["goodput_rps"] == one[0].summary["goodput_rps"]


def test_plan_prints_the_cheapest_deployment_and_writes_its_llmdeployment(tmp_path):
    out = tmp_path / "plan.yaml"
    result = tandem(
        "plan", "--target-rate", "40", "--num-requests", "60", "--prompt-tokens", "512,2048",
        "--output-tokens", "8,32", "--tp", "1", "--thresholds", "0,512", "--max-devices", "4",
        "--slo-ttft", "0.3", "--slo-tpot", "0.05", "--max-model-len", "4096",
        "--yaml", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    cheapest = re.search(r"^cheapest: (\d+) devices", result.stdout, re.MULTILINE)
    assert cheapest, result.stdout
    devices = int(cheapest.group(1))
    met = [int(n) for n in re.findall(r"^(\d+) devices.*meets the SLOs$", result.stdout, re.M)]
    assert met and min(met) == devices
    body = yaml.safe_load(out.read_text())
    assert yaml.safe_load(result.stdout[result.stdout.index("apiVersion") :]) == body
    spec = parse(body)  # the operator takes it
    pools = (spec.prefill, spec.decode)
    assert sum(p.replicas * p.tensor_parallel_size for p in pools) == devices
    assert body["spec"]["model"]["maxModelLen"] == 4096


def test_plan_refuses_bad_input_and_says_when_nothing_meets_the_slos():
    result = tandem("plan", "--target-rate", "0", "--num-requests", "5")
    assert result.returncode != 0 and "--target-rate > 0" in result.stderr
    result = tandem("plan", "--target-rate", "5", "--tp", "1,x")
    assert result.returncode != 0 and "comma-separated integers" in result.stderr
    result = tandem(
        "plan", "--target-rate", "40", "--num-requests", "20", "--tp", "1", "--thresholds", "0",
        "--max-devices", "2", "--slo-ttft", "0.0001", "--max-model-len", "4096",
    )  # fmt: skip
    assert result.returncode != 0 and "no deployment of up to 2" in result.stderr
