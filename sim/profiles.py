"""Device profiles: what the step-time and transfer models know about a device.

A profile is a JSON file (`DeviceProfile.save` / `load_profile`). The H100 and H200 files
shipped in `profiles/` come from public specifications (their `source` field says which)
with efficiency factors and overheads that are assumptions until a GPU run calibrates them;
`bench/calibrate.py` fits a profile from the engine's measured step times on this machine.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"


@dataclass(frozen=True)
class DeviceProfile:
    """One device (one GPU, or one CPU engine process) and its links.

    Step time = `step_overhead_s` + `seq_overhead_s` per sequence + `token_overhead_s` per
    sampled token + the role's host overheads (`host_overhead`) + the compute and memory
    times (max of the two when `overlap`, the GPU roofline; their sum otherwise, as on a CPU
    where one core does both) + the tensor-parallel all-reduces. Attention's FLOPs run at
    `attention_efficiency` of the rate of the rest (the matrix products with the weights).
    """

    name: str
    source: str
    peak_flops: float  # FLOP/s, dense, in `dtype_bytes` precision
    mem_bandwidth: float  # bytes/s
    memory_bytes: float  # device memory, for sizing the KV cache
    dtype_bytes: int = 2
    compute_efficiency: float = 1.0  # achieved / peak FLOP/s
    attention_efficiency: float = 1.0  # attention's FLOP/s / the weight products'
    bandwidth_efficiency: float = 1.0  # achieved / peak bytes/s
    step_overhead_s: float = 0.0
    seq_overhead_s: float = 0.0
    overlap: bool = True
    tp_bandwidth: float = 0.0  # bytes/s per device for TP all-reduces (NVLink)
    tp_latency_s: float = 0.0  # per all-reduce
    kv_link_bandwidth: float = 1e9  # bytes/s of a KV write between nodes
    kv_transfer_latency_s: float = 0.0  # per write posted
    kv_descriptor_s: float = 0.0  # per descriptor (run of adjacent blocks) in a write
    network_latency_s: float = 0.0  # one message hop (HTTP, ZMQ, KV events)
    # A node's copies between its KV tiers (docs/kv-tiers.md), one at a time, each
    # `latency + blocks * block bytes / bandwidth`: device<->host over the host link
    # (PCIe on a GPU, a memory copy on a CPU), host->disk and disk->device at the disk's
    # rate, the slower part of those. The defaults are datasheet-order estimates for a GPU
    # host without figures of its own: PCIe Gen4 x16 pinned copies (~25 GB/s achieved) and a
    # Gen4 NVMe drive (~3 GB/s, ~0.1 ms a request). The shipped profiles' `source` says where
    # theirs come from (the CPU's: bench/kv_tiers.py --copy-probe).
    host_link_bandwidth: float = 25e9  # bytes/s, device<->host
    host_link_latency_s: float = 1e-05  # per copy
    disk_bandwidth: float = 3e9  # bytes/s, host->disk and disk->device
    disk_latency_s: float = 1e-04  # per copy
    # Per token a step samples: streaming it out (detokenization, a record over HTTP), which
    # on a CPU node shares the engine's interpreter; fitted by bench/sim_validate.py.
    token_overhead_s: float = 0.0
    # A node's work around each step outside the model (scheduling, detokenizing, streaming
    # records, metrics, KV events), per role: per step and per sequence in the batch. On a
    # CPU host it takes the cores as the model does. Measured on a real deployment from the
    # nodes' step logs (`GET /debug/steps`) by bench/sim_validate.py.
    decode_step_overhead_s: float = 0.0
    decode_seq_overhead_s: float = 0.0
    prefill_step_overhead_s: float = 0.0
    prefill_seq_overhead_s: float = 0.0
    # CPU hosts: CPU seconds that the router and the clients on the same host each spend
    # per request before the router routes it (`request`: sending it, parsing it), per
    # request when it ends (`finish`: the rest of a request's work) and per token relayed
    # (after each decode step); the router's forwarding of a request to its decode worker
    # (`forward`) is a turn of its own after the routing decision, behind what its loop
    # took up meanwhile. Each is a single-threaded process on the host's cores
    # (`sim/host_process.py`). 0 where they have cores of their own. Measured by
    # bench/sim_validate.py.
    host_router_request_s: float = 0.0
    host_router_forward_s: float = 0.0
    host_router_finish_s: float = 0.0
    host_router_token_s: float = 0.0
    host_client_request_s: float = 0.0
    host_client_finish_s: float = 0.0
    host_client_token_s: float = 0.0
    # CPU hosts: a decode node's HTTP thread (its event loop), per request before the
    # engine thread takes it (the body's validation, the hand-over); one single-threaded
    # process per decode node on the host's cores, as the router is. Its per-token work
    # is in the decode steps' fitted overhead. Measured by bench/sim_validate.py.
    host_decode_request_s: float = 0.0
    memory_utilization: float = 0.9
    # CPU hosts: every node of a simulated deployment shares these cores (`tandem serve` on
    # one machine), so a step stretches while more nodes step at once than there are cores.
    # 0: each node has devices of its own.
    host_cores: int = 0
    # CPU hosts shared with other tenants: their runnable threads on those cores (a load
    # average measured without the deployment), which take their share of the cores too.
    host_background_load: float = 0.0
    # CPU hosts: the share by which each prefill step running on the host slows a decode
    # step's own work (shared caches, memory bandwidth; `sim/shared_cores.py`), fitted from
    # the nodes' step logs by bench/sim_validate.py. 0 on devices of their own.
    host_interference: float = 0.0
    # CPU hosts: the kernel's time slice (seconds a thread that never waits keeps a core
    # while other work waits; `sim/sliced_cores.py`), and how long a decode and a prefill
    # node's engine thread runs inside a step before it leaves its core by itself (the
    # interpreter lock). Measured by bench/sim_validate.py. 0: the cores are shared
    # evenly all the time (processor sharing, `sim/shared_cores.py`).
    host_time_slice_s: float = 0.0
    host_decode_run_s: float = 0.0
    host_prefill_run_s: float = 0.0
    # A role's steps around the model: the model runner's time of each step is the model's
    # times a factor drawn, step by step and independently, from a log-normal distribution
    # of median `*_step_scale` and this standard deviation of its logarithm
    # (`sim/step_spread.py`). Spread 0 and scale 1: every step takes exactly the model's
    # time. Measured from the nodes' step logs by bench/sim_validate.py, for a role whose
    # steps vary independently from one to the next.
    decode_step_spread: float = 0.0
    prefill_step_spread: float = 0.0
    decode_step_scale: float = 1.0
    prefill_step_scale: float = 1.0

    def __post_init__(self) -> None:
        positive = ("peak_flops", "mem_bandwidth", "kv_link_bandwidth", "attention_efficiency")
        links = ("host_link_bandwidth", "disk_bandwidth")
        for name in (*positive, *links, "decode_step_scale", "prefill_step_scale"):
            if getattr(self, name) <= 0:
                raise ValueError(f"profile {self.name!r}: {name} must be positive")
        for name in ("compute_efficiency", "bandwidth_efficiency", "memory_utilization"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"profile {self.name!r}: {name} must be in (0, 1]")
        spreads = ("decode_step_spread", "prefill_step_spread")
        non_negative = [f.name for f in fields(self) if f.name.startswith("host_")]
        for name in (*non_negative, *spreads, "disk_latency_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"profile {self.name!r}: {name} must not be negative")

    def host_run_s(self, role: str) -> float | None:
        """How long a `role` node's engine thread runs before it yields its core (None:
        until the kernel's slice ends)."""
        return {"decode": self.host_decode_run_s, "prefill": self.host_prefill_run_s}[role] or None

    def step_spread(self, role: str) -> tuple[float, float]:
        """A `role` node's step-time factor: its median and the standard deviation of its
        logarithm."""
        return {
            "decode": (self.decode_step_scale, self.decode_step_spread),
            "prefill": (self.prefill_step_scale, self.prefill_step_spread),
        }[role]

    def host_overhead(self, role: str) -> tuple[float, float]:
        """(per step, per sequence) seconds of a `role` node's work outside the model."""
        if role not in ("decode", "prefill"):
            raise ValueError(f"unknown node role {role!r}")
        return getattr(self, f"{role}_step_overhead_s"), getattr(self, f"{role}_seq_overhead_s")

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2) + "\n")


def load_profile(name_or_path: str) -> DeviceProfile:
    """A shipped profile by name (`h100`, `h200`, `cpu`) or a profile JSON file.
    Raises ValueError for an unknown name or a file with unknown fields."""
    path = Path(name_or_path)
    if not path.is_file():
        path = PROFILE_DIR / f"{name_or_path}.json"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in PROFILE_DIR.glob("*.json")))
        raise ValueError(f"unknown device profile {name_or_path!r}: a JSON file or one of {known}")
    raw = json.loads(path.read_text())
    unknown = set(raw) - {f.name for f in fields(DeviceProfile)}
    if unknown:
        raise ValueError(f"{path}: unknown profile fields {sorted(unknown)}")
    return DeviceProfile(**raw)
