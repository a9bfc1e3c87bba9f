"""The planner's settings read from the `LLMDeployment` it plans for (`planner_settings`):
the SLOs and bounds of `spec.slo`, the deployment as it runs (TP sizes, threshold, engine
limits, routing policy), the model's shape and the device profile.

A pool `spec.slo` leaves out keeps its `replicas` (its bounds are that count). The shape is
`spec.slo.simulator.model` (a shipped name or a folder in the planner's pod), else the
model's own `config.json`, which the operator mounts into the planner's pod for a hostPath or
PVC source. The profile is `spec.slo.simulator.profile`, else `h100` for pools that ask for
GPUs and `cpu` otherwise; the planner corrects it from the measured latencies.
"""

from __future__ import annotations

from tandem.operator.engine_config import model_dir
from tandem.operator.slo import PoolBounds
from tandem.operator.spec import LLMDeploymentSpec
from tandem.planner.layout_search import Bounds
from tandem.planner.planner import PlannerSettings
from tandem.sim.cluster import ClusterConfig
from tandem.sim.profiles import DeviceProfile, load_profile
from tandem.sim.results import SLO
from tandem.sim.shapes import ModelShape, load_shape

GPU = "nvidia.com/gpu"


def planner_settings(
    spec: LLMDeploymentSpec, shape: ModelShape, profile: DeviceProfile
) -> PlannerSettings:
    """Raises ValueError when the spec has no `slo`."""
    slo = spec.slo
    if slo is None:
        raise ValueError("the LLMDeployment has no spec.slo: nothing to plan")
    return PlannerSettings(
        slo=SLO(ttft_s=slo.ttft_s, tpot_s=slo.tpot_s),
        attainment=slo.attainment,
        prefill=_bounds(slo.prefill, spec.prefill.replicas),
        decode=_bounds(slo.decode, spec.decode.replicas),
        base=ClusterConfig(
            policy=spec.router.policy,
            remote_prefill_threshold=spec.remote_prefill_threshold,
            tp_prefill=spec.prefill.tensor_parallel_size,
            tp_decode=spec.decode.tensor_parallel_size,
            block_size=spec.engine.block_size,
            max_num_batched_tokens=spec.engine.max_num_batched_tokens,
            max_num_seqs=spec.engine.max_num_seqs,
            max_model_len=spec.model.max_model_len or shape.max_position_embeddings,
            on_prefill_failure=spec.on_prefill_failure,
        ),
        shape=shape,
        profile=profile,
        thresholds=_thresholds(spec),
    )


def _thresholds(spec: LLMDeploymentSpec) -> tuple[int, ...]:
    """What the planner may choose among: none unless `spec.slo` lists some; then those and
    the spec's own (where it starts)."""
    listed = spec.slo.remote_prefill_thresholds if spec.slo is not None else ()
    return tuple(sorted({spec.remote_prefill_threshold, *listed})) if listed else ()


def model_shape(spec: LLMDeploymentSpec) -> ModelShape:
    """Raises ValueError when neither a shape is named nor the model folder has one."""
    named = spec.slo.model if spec.slo is not None else None
    try:
        return load_shape(named or model_dir(spec))
    except ValueError as exc:
        raise ValueError(
            f"{exc}; name the model's shape in spec.slo.simulator.model (a shipped shape or a "
            "folder with a config.json in the planner's pod)"
        ) from exc


def device_profile(spec: LLMDeploymentSpec) -> DeviceProfile:
    named = spec.slo.profile if spec.slo is not None else None
    if named:
        return load_profile(named)
    gpus = any(_gpus(spec, role) for role in ("prefill", "decode"))
    return load_profile("h100" if gpus else "cpu")


def _gpus(spec: LLMDeploymentSpec, role: str) -> bool:
    """The role's pods ask for GPUs (a limit of 0: pods for a node without them)."""
    limits = spec.pool(role).resources.get("limits") or {}
    return float(str(limits.get(GPU, 0))) > 0


def _bounds(bounds: PoolBounds | None, replicas: int) -> Bounds:
    if bounds is None:
        return Bounds(replicas, replicas)
    return Bounds(bounds.min_replicas, bounds.max_replicas)
