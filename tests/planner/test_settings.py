"""The planner's settings read from an LLMDeployment."""

from __future__ import annotations

import pytest

from tandem.operator.spec import parse
from tandem.planner.layout_search import Bounds
from tandem.planner.settings import device_profile, model_shape, planner_settings
from tandem.sim.shapes import SHAPES
from tests.operator.crd_schema import example


def spec(slo: dict, **pools):
    llmd = example("minimal")
    llmd["spec"]["slo"] = {"ttftMs": 800, "tpotMs": 60, **slo}
    llmd["spec"].update(pools)
    return parse(llmd)


def test_the_settings_follow_the_resource():
    s = spec(
        {"decode": {"minReplicas": 2, "maxReplicas": 6}, "attainment": 0.95},
        prefill={"replicas": 3, "tensorParallelSize": 2},
        disaggregation={"remotePrefillThreshold": 256},
        engine={"blockSize": 32, "maxNumSeqs": 64},
    )
    settings = planner_settings(s, SHAPES["llama-3-8b"], device_profile(s))
    assert (settings.slo.ttft_s, settings.slo.tpot_s, settings.attainment) == (0.8, 0.06, 0.95)
    assert settings.decode == Bounds(2, 6)
    assert settings.prefill == Bounds(3, 3)  # not planned: its own count
    base = settings.base
    assert (base.tp_prefill, base.tp_decode, base.remote_prefill_threshold) == (2, 1, 256)
    assert (base.block_size, base.max_num_seqs, base.max_model_len) == (32, 64, 8192)


@pytest.mark.parametrize(
    ("limits", "named", "profile"),
    [({}, None, "cpu"), ({"nvidia.com/gpu": 0}, None, "cpu"), ({"nvidia.com/gpu": 1}, None, "h100"),
     ({"nvidia.com/gpu": "2"}, None, "h100"), ({}, "h200", "h200")],
)  # fmt: skip
def test_the_profile_is_named_or_follows_the_gpus_asked_for(limits, named, profile):
    simulator = {"simulator": {"profile": named}} if named else {}
    s = spec({"decode": {"maxReplicas": 2}, **simulator}, decode={"resources": {"limits": limits}})
    assert device_profile(s).name == profile


def test_the_shape_is_named_or_read_from_the_model_folder(tmp_path):
    named = spec({"decode": {"maxReplicas": 2}, "simulator": {"model": "llama-3-70b"}})
    assert model_shape(named) == SHAPES["llama-3-70b"]
    # the minimal example's model is on a claim, mounted at /models/<path>: absent here
    with pytest.raises(ValueError, match=r"spec\.slo\.simulator\.model"):
        model_shape(spec({"decode": {"maxReplicas": 2}}))


def test_a_spec_without_slo_has_nothing_to_plan():
    llmd = example("minimal")
    with pytest.raises(ValueError, match=r"no spec\.slo"):
        planner_settings(parse(llmd), SHAPES["llama-3-8b"], device_profile(parse(llmd)))
