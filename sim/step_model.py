"""Stand-in for the model: how long one engine step takes, from the model's shape, the
device profile and the step's plan (tokens per request and their context lengths)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tandem.engine.telemetry.step_log import StepWork
from tandem.sim.profiles import DeviceProfile
from tandem.sim.shapes import ModelShape


@dataclass(frozen=True)
class StepShape:
    """What the step computes (the engine's `StepWork`: its batch summed), and how many of
    its requests reach their end and get logits."""

    work: StepWork
    num_sampled: int

    @classmethod
    def of(
        cls, num_tokens: Sequence[int], context_lens: Sequence[int], num_sampled: int
    ) -> StepShape:
        """Per request its new tokens and its context after the step."""
        return cls(StepWork.of(num_tokens, context_lens), num_sampled)

    @property
    def num_seqs(self) -> int:
        return self.work.num_seqs


@dataclass(frozen=True)
class StepCost:
    flops: float
    attention_flops: float  # the part of `flops` that attention's scores and sums take
    bytes: float
    comm_bytes: float  # per device, for the TP all-reduces


class StepTimeModel:
    """Roofline of one step on `tp` devices, plus the profile's fitted overheads and, for a
    node of `role`, its host work around the step."""

    def __init__(
        self, shape: ModelShape, profile: DeviceProfile, tp: int = 1, role: str | None = None
    ) -> None:
        if tp < 1 or (shape.num_kv_heads % tp and tp % shape.num_kv_heads):
            raise ValueError(f"tensor parallel size {tp} does not divide the KV heads")
        self.shape = shape
        self.profile = profile
        self.tp = tp
        self._host_step, self._host_seq = profile.host_overhead(role) if role else (0.0, 0.0)
        m, b = shape, profile.dtype_bytes
        self._attn_dim = m.num_layers * m.num_heads * m.head_dim
        self._kv_per_token = m.kv_bytes_per_token(b)
        self._weight_bytes = m.num_params * b
        self._lm_head_flops = 2 * m.hidden_size * m.vocab_size

    def cost(self, step: StepShape) -> StepCost:
        """FLOPs and bytes of the whole step (all TP ranks together)."""
        m, w = self.shape, step.work
        total = w.num_tokens
        attention = 4 * self._attn_dim * w.num_attention_pairs
        flops = 2 * m.layer_params * total + attention + self._lm_head_flops * step.num_sampled
        kv_read = self._kv_per_token * w.num_context_tokens
        kv_write = self._kv_per_token * total
        comm = 2 * m.num_layers * total * m.hidden_size * self.profile.dtype_bytes
        return StepCost(flops, attention, self._weight_bytes + kv_read + kv_write, comm)

    def step_time(self, step: StepShape, factor: float = 1.0) -> float:
        """Seconds of the step; `factor` scales the model runner's part (drawn for this
        step from the role's spread, `sim/step_spread.py`), not the node's host work around
        it nor the per-token cost."""
        host = self._host_step + self._host_seq * step.num_seqs
        tokens = self.profile.token_overhead_s * step.num_sampled
        return factor * self.runner_time(step) + host + tokens

    def runner_time(self, step: StepShape) -> float:
        """Seconds of the model runner's part of the step: the profile's step and sequence
        overheads (fitted on the runner's own time) and the compute, memory and all-reduce
        times."""
        p, tp = self.profile, self.tp
        cost = self.cost(step)
        weights = cost.flops - cost.attention_flops
        attention = cost.attention_flops / p.attention_efficiency
        compute = (weights + attention) / tp / (p.peak_flops * p.compute_efficiency)
        memory = cost.bytes / tp / (p.mem_bandwidth * p.bandwidth_efficiency)
        work = max(compute, memory) if p.overlap else compute + memory
        if tp > 1:  # ring all-reduce: 2 (tp-1)/tp of the activations per device, per layer x2
            work += 2 * self.shape.num_layers * p.tp_latency_s
            work += cost.comm_bytes * 2 * (tp - 1) / tp / p.tp_bandwidth
        return p.step_overhead_s + p.seq_overhead_s * step.num_seqs + work

    def kv_blocks_per_device(self, block_size: int) -> int:
        """KV blocks that fit beside this rank's share of the weights."""
        p = self.profile
        free = p.memory_bytes * p.memory_utilization - self._weight_bytes / self.tp
        block_bytes = self._kv_per_token * block_size / self.tp
        if free < block_bytes:
            raise ValueError(f"{self.shape.name} at TP {self.tp} does not fit in {p.name}'s memory")
        return int(free // block_bytes)
