"""`tandem plan`'s search: the cheapest deployment (fewest devices) that meets the SLOs on a
workload, found by simulating candidates in order of cost.

A candidate is a TP size (the same for both pools), a prefill:decode split of the devices
(no prefill pool: aggregated) and, when disaggregated, a remote-prefill threshold. It meets
the SLOs when at least `attainment` of its requests have TTFT and TPOT under the targets
(and all of them finished). Candidates of one device count are all simulated, the one with
the highest goodput wins; the search stops at the first device count with a winner.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import yaml

from tandem.sim.cluster import ClusterConfig
from tandem.sim.profiles import DeviceProfile
from tandem.sim.results import SLO
from tandem.sim.shapes import ModelShape
from tandem.sim.simulate import simulate
from tandem.sim.workload import SimRequest


@dataclass(frozen=True)
class SearchSpace:
    tp_sizes: tuple[int, ...] = (1, 2, 4, 8)
    thresholds: tuple[int, ...] = (0, 512, 2048)
    max_devices: int = 16
    attainment: float = 0.9


@dataclass(frozen=True)
class Candidate:
    config: ClusterConfig
    summary: dict[str, Any]

    @property
    def meets(self) -> bool:
        return self.summary.get("meets_slo", False)


def candidates(base: ClusterConfig, space: SearchSpace, devices: int) -> Iterator[ClusterConfig]:
    """Every configuration of exactly `devices` devices in the space."""
    for tp in space.tp_sizes:
        if devices % tp:
            continue
        nodes = devices // tp
        for num_prefill in range(nodes):
            common = replace(
                base, num_prefill=num_prefill, num_decode=nodes - num_prefill,
                tp_prefill=tp, tp_decode=tp,
            )  # fmt: skip
            if num_prefill == 0:
                yield replace(common, remote_prefill_threshold=0)
                continue
            for threshold in space.thresholds:
                yield replace(common, remote_prefill_threshold=threshold)


def evaluate(
    config: ClusterConfig,
    shape: ModelShape,
    profile: DeviceProfile,
    requests: Sequence[SimRequest],
    slo: SLO,
    attainment: float,
) -> Candidate | None:
    """Simulate one candidate; None when the model does not fit its devices."""
    try:
        summary = simulate(config, shape, profile, requests, slo)
    except ValueError:
        return None
    finished = summary["num_finished"] == summary["num_requests"]
    summary["meets_slo"] = finished and summary["slo"]["attained"] >= attainment
    return Candidate(config, summary)


def search(
    base: ClusterConfig,
    shape: ModelShape,
    profile: DeviceProfile,
    requests: Sequence[SimRequest],
    slo: SLO,
    space: SearchSpace,
    log=print,
) -> tuple[Candidate | None, list[Candidate]]:
    """(the cheapest candidate meeting the SLOs or None, every candidate simulated)."""
    tried: list[Candidate] = []
    for devices in range(1, space.max_devices + 1):
        winners = []
        for config in candidates(base, space, devices):
            found = evaluate(config, shape, profile, requests, slo, space.attainment)
            if found is None:
                continue
            tried.append(found)
            log(describe(found))
            if found.meets:
                winners.append(found)
        if winners:
            return max(winners, key=lambda c: c.summary["goodput_rps"]), tried
    return None, tried


def describe(c: Candidate) -> str:
    cfg, s = c.config, c.summary
    layout = (
        f"{cfg.num_prefill}P+{cfg.num_decode}D TP{cfg.tp_decode} threshold "
        f"{cfg.remote_prefill_threshold}"
        if cfg.num_prefill
        else f"aggregated {cfg.num_decode}x TP{cfg.tp_decode}"
    )
    return (
        f"{cfg.num_devices} devices, {layout}: SLO met by {100 * s['slo']['attained']:.0f}%, "
        f"goodput {s['goodput_rps']:.2f} req/s, TTFT p90 {s['ttft_s']['p90']:.3f} s, "
        f"TPOT p90 {1e3 * (s['tpot_s']['p90'] or 0):.1f} ms"
        + (" <- meets the SLOs" if c.meets else "")
    )


def deployment_yaml(c: Candidate, model_name: str, policy: str) -> str:
    """An `LLMDeployment` for the candidate (the model's source is for the user to fill)."""
    cfg = c.config
    gpus = {"limits": {"nvidia.com/gpu": cfg.tp_decode}}
    spec: dict[str, Any] = {
        "model": {
            "name": model_name,
            "source": {"pvc": {"claimName": "models", "path": model_name}},
            "maxModelLen": cfg.max_model_len,
        },
        "engine": {
            "blockSize": cfg.block_size,
            "maxNumBatchedTokens": cfg.max_num_batched_tokens,
            "maxNumSeqs": cfg.max_num_seqs,
        },
        "router": {"policy": policy},
        "prefill": {
            "replicas": cfg.num_prefill,
            "tensorParallelSize": cfg.tp_prefill,
            "resources": {"limits": {"nvidia.com/gpu": cfg.tp_prefill}},
        },
        "decode": {
            "replicas": cfg.num_decode,
            "tensorParallelSize": cfg.tp_decode,
            "resources": gpus,
        },
        "disaggregation": {"remotePrefillThreshold": cfg.remote_prefill_threshold},
    }
    body = {
        "apiVersion": "tandem.dev/v1alpha1",
        "kind": "LLMDeployment",
        "metadata": {"name": _dns_name(model_name)},
        "spec": spec,
    }
    return yaml.safe_dump(body, sort_keys=False)


def _dns_name(name: str) -> str:
    cleaned = "".join(ch if ch.isalnum() else "-" for ch in name.lower()).strip("-")
    return cleaned[:63] or "llm"
