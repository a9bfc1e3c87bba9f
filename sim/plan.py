"""`tandem plan`'s search: the cheapest deployment (fewest devices) that meets the SLOs on a
workload, found by simulating candidates in order of cost.

A candidate is a prefill:decode split of the devices (no prefill pool: aggregated), a TP
size for each pool (they may differ: prefill TP 1 beside decode TP 2 is a layout of its own,
design §4's per-rank transfer) and, when disaggregated, a remote-prefill threshold. It meets
the SLOs when at least `attainment` of its requests have TTFT and TPOT under the targets
(and all of them finished). Candidates of one device count are all simulated, the one with
the highest goodput wins; the search stops at the first device count with a winner.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

import yaml

from tandem.sim.cluster import ClusterConfig
from tandem.sim.plan_pool import CandidatePool
from tandem.sim.profiles import DeviceProfile
from tandem.sim.results import SLO
from tandem.sim.shapes import ModelShape
from tandem.sim.simulate import simulate
from tandem.sim.workload import SimRequest


@dataclass(frozen=True)
class SearchSpace:
    """`tp_sizes`: both pools' TP sizes, unless `tp_prefill` or `tp_decode` narrows one."""

    tp_sizes: tuple[int, ...] = (1, 2, 4, 8)
    thresholds: tuple[int, ...] = (0, 512, 2048)
    max_devices: int = 16
    attainment: float = 0.9
    tp_prefill: tuple[int, ...] | None = None
    tp_decode: tuple[int, ...] | None = None

    @property
    def prefill_sizes(self) -> tuple[int, ...]:
        return self.tp_prefill or self.tp_sizes

    @property
    def decode_sizes(self) -> tuple[int, ...]:
        return self.tp_decode or self.tp_sizes


@dataclass(frozen=True)
class Candidate:
    config: ClusterConfig
    summary: dict[str, Any]

    @property
    def meets(self) -> bool:
        return self.summary.get("meets_slo", False)


def candidates(base: ClusterConfig, space: SearchSpace, devices: int) -> Iterator[ClusterConfig]:
    """Every configuration of exactly `devices` devices in the space: aggregated for each
    decode TP, then for each (prefill TP, decode TP) every split and threshold."""
    for tp_d in space.decode_sizes:
        if devices % tp_d == 0:
            yield replace(
                base, num_prefill=0, num_decode=devices // tp_d, tp_prefill=1, tp_decode=tp_d,
                remote_prefill_threshold=0,
            )  # fmt: skip
    for tp_p in space.prefill_sizes:
        for tp_d in space.decode_sizes:
            for num_prefill in range(1, devices // tp_p + 1):
                rest = devices - num_prefill * tp_p
                if rest < tp_d or rest % tp_d:
                    continue
                common = replace(
                    base, num_prefill=num_prefill, num_decode=rest // tp_d,
                    tp_prefill=tp_p, tp_decode=tp_d,
                )  # fmt: skip
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
    """Simulate one candidate, stopped as soon as it cannot meet the SLOs; None when the
    model does not fit its devices."""
    try:
        summary = simulate(config, shape, profile, requests, slo, attainment=attainment)
    except ValueError:
        return None
    finished = summary["num_finished"] == summary["num_requests"]
    met = finished and summary["slo"]["attained"] >= attainment
    summary["meets_slo"] = met and not summary["stopped_early"]
    return Candidate(config, summary)


def search(
    base: ClusterConfig,
    shape: ModelShape,
    profile: DeviceProfile,
    requests: Sequence[SimRequest],
    slo: SLO,
    space: SearchSpace,
    log=print,
    jobs: int = 1,
) -> tuple[Candidate | None, list[Candidate]]:
    """(the cheapest candidate meeting the SLOs or None, every candidate simulated); `jobs`
    candidates of a device count are simulated at once, each in a process of its own."""
    requests = materialized(requests)
    tried: list[Candidate] = []
    with CandidatePool(shape, profile, requests, slo, space.attainment, jobs) as pool:
        for devices in range(1, space.max_devices + 1):
            found = [c for c in pool.evaluate_all(list(candidates(base, space, devices))) if c]
            for c in found:
                log(describe(c))
            tried.extend(found)
            winners = [c for c in found if c.meets]
            if winners:
                return max(winners, key=lambda c: c.summary["goodput_rps"]), tried
    return None, tried


def materialized(requests: Sequence[SimRequest]) -> list[SimRequest]:
    """The requests with their prompts' token ids drawn once: a workload's prompts are
    otherwise drawn anew at each arrival (`SimRequest.token_ids`), in every candidate's
    run, which was half of a candidate's time on a trace of long prompts."""
    return [
        SimRequest.of_tokens(r.request_id, r.arrival_s, r.token_ids(), r.num_output_tokens)
        for r in requests
    ]


def describe(c: Candidate) -> str:
    cfg, s = c.config, c.summary
    layout = (
        f"{cfg.num_prefill}P TP{cfg.tp_prefill} + {cfg.num_decode}D TP{cfg.tp_decode}, "
        f"threshold {cfg.remote_prefill_threshold}"
        if cfg.num_prefill
        else f"aggregated {cfg.num_decode}x TP{cfg.tp_decode}"
    )
    if s.get("stopped_early"):
        return (
            f"{cfg.num_devices} devices, {layout}: SLOs lost after {s['num_finished']} of "
            f"{s['num_requests']} arrived requests finished (simulation stopped)"
        )
    return (
        f"{cfg.num_devices} devices, {layout}: SLO met by {100 * s['slo']['attained']:.0f}%, "
        f"goodput {s['goodput_rps']:.2f} req/s, TTFT p90 {s['ttft_s']['p90']:.3f} s, "
        f"TPOT p90 {1e3 * (s['tpot_s']['p90'] or 0):.1f} ms"
        + (" <- meets the SLOs" if c.meets else "")
    )


def deployment_yaml(
    c: Candidate, model_name: str, policy: str, tiers_gib: tuple[float, float] = (0.0, 0.0)
) -> str:
    """An `LLMDeployment` for the candidate (the model's source is for the user to fill);
    `tiers_gib`: each node's host and disk KV tiers (0: none), as `kvTiers` of both pools."""
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
    if tiers_gib[0]:
        for pool in ("prefill", "decode"):
            spec[pool]["kvTiers"] = _kv_tiers(*tiers_gib)
    body = {
        "apiVersion": "tandem.dev/v1alpha1",
        "kind": "LLMDeployment",
        "metadata": {"name": _dns_name(model_name)},
        "spec": spec,
    }
    return yaml.safe_dump(body, sort_keys=False)


def _kv_tiers(host_gib: float, disk_gib: float) -> dict[str, Any]:
    """`kvTiers` of a pool: the disk on the operator's default volume (an emptyDir)."""
    tiers = {"host": {"size": _gib(host_gib)}}
    if disk_gib:
        tiers["disk"] = {"size": _gib(disk_gib)}
    return tiers


def _gib(gib: float) -> str:
    """8.0 -> "8Gi", 0.25 -> "0.25Gi": a quantity, the flag's value exactly."""
    return format(Decimal(repr(gib)).normalize(), "f") + "Gi"


def _dns_name(name: str) -> str:
    cleaned = "".join(ch if ch.isalnum() else "-" for ch in name.lower()).strip("-")
    return cleaned[:63] or "llm"
