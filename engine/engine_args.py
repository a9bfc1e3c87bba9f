"""The engine's user-facing knobs (`EngineArgs`, the flags of `tandem generate` and every
node) and their validation into an `EngineConfig`: the model's config read, the dtype and
device resolved, and the KV cache sized to the device's memory when not given."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import torch

from tandem.engine.core.config import (
    CacheConfig,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
    resolve_device,
    resolve_dtype,
    resolve_kernels,
)
from tandem.engine.model_runner import activation_bytes, kv_block_bytes
from tandem.engine.transfer.kv_staging import plan_block_bytes

# KV-cache budget on the CPU when `num_kv_blocks` is not given.
_CPU_KV_CACHE_BYTES = 2 << 30


@dataclass(frozen=True)
class EngineArgs:
    """User-facing knobs; `create_config` validates them into an `EngineConfig`."""

    model: str
    dtype: str = "auto"
    device: str = "auto"
    block_size: int = 16
    num_kv_blocks: int | None = None
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    gpu_memory_utilization: float = 0.9
    seed: int = 0
    kernels: str = "auto"
    enforce_eager: bool = False
    kv_hugepages: bool = False
    tensor_parallel_size: int = 1
    peer_tensor_parallel_sizes: tuple[int, ...] = ()  # of the nodes this one writes KV to
    kv_host_gib: float = 0.0  # the host-memory KV tier (0: none)
    kv_disk_gib: float = 0.0  # the disk KV tier under it (0: none)
    kv_disk_dir: str | None = None  # the folder of the disk tier's file

    def create_config(self) -> EngineConfig:
        model = ModelConfig.from_pretrained(self.model)
        device = resolve_device(self.device)
        max_model_len = self.max_model_len or model.max_position_embeddings
        scheduler = SchedulerConfig(self.max_num_batched_tokens, self.max_num_seqs, max_model_len)
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        kernels = resolve_kernels(self.kernels, device)
        probe = EngineConfig(
            self.model,
            model,
            CacheConfig(
                self.block_size,
                1,
                self.enable_prefix_caching,
                self.kv_hugepages,
                tuple(self.peer_tensor_parallel_sizes),
            ),
            scheduler,
            device,
            resolve_dtype(self.dtype, model, device),
            self.seed,
            kernels,
            kernels == "triton" and not self.enforce_eager,
            self.tensor_parallel_size,
        )
        num_blocks = self.num_kv_blocks or self._default_num_blocks(probe)
        check_kv_cache_fits(probe, num_blocks)
        host_blocks, disk_blocks = self._tier_blocks(probe)
        cache = dataclasses.replace(
            probe.cache,
            num_blocks=num_blocks,
            host_blocks=host_blocks,
            disk_blocks=disk_blocks,
            disk_dir=self.kv_disk_dir,
        )
        return dataclasses.replace(probe, cache=cache)

    def _tier_blocks(self, probe: EngineConfig) -> tuple[int, int]:
        """The lower KV tiers' sizes in blocks (whole blocks that fit in the GiB given)."""
        for name in ("kv_host_gib", "kv_disk_gib"):
            if not 0 <= getattr(self, name) < float("inf"):
                raise ValueError(f"{name} must be a size in GiB, at least 0")
        if not (self.kv_host_gib or self.kv_disk_gib):
            return 0, 0
        if self.tensor_parallel_size != 1:
            raise ValueError("KV tiers need tensor_parallel_size 1 for now")
        block_bytes = kv_block_bytes(probe)
        host, disk = (
            int(gib * 2**30) // block_bytes for gib in (self.kv_host_gib, self.kv_disk_gib)
        )
        for gib, blocks, name in (
            (self.kv_host_gib, host, "host"),
            (self.kv_disk_gib, disk, "disk"),
        ):
            if gib and not blocks:
                raise ValueError(
                    f"a {name} KV tier of {gib} GiB holds no block of {block_bytes} bytes"
                )
        return host, disk

    def _default_num_blocks(self, probe: EngineConfig) -> int:
        """On a GPU, what fits in `gpu_memory_utilization` of the free memory once the
        weights and the activations of the largest step are counted; on the CPU, enough for
        every sequence at full length, capped by a fixed budget. A block costs its slot in
        every staging mirror too (`kv_staging`)."""
        block_bytes = plan_block_bytes(probe)
        if probe.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(probe.device)
            weights = probe.model.num_parameters() * probe.dtype.itemsize
            weights //= probe.tensor_parallel_size  # this rank's share, about
            budget = int(free * self.gpu_memory_utilization) - weights - activation_bytes(probe)
            if budget < block_bytes:
                raise ValueError(f"no GPU memory left for the KV cache ({free} bytes free)")
            return budget // block_bytes
        per_seq = -(-probe.scheduler.max_model_len // self.block_size)
        wanted = per_seq * probe.scheduler.max_num_seqs
        return max(1, min(wanted, _CPU_KV_CACHE_BYTES // block_bytes))


def device_memory_bytes(device: torch.device) -> int:
    """All the memory of `device`: the GPU's, or the machine's for the CPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_kv_cache_fits(config: EngineConfig, num_blocks: int) -> None:
    """Raise ValueError when `num_blocks` blocks exceed the device's whole memory, before
    the block pool (one Python object per block) or the tensor is built."""
    need, have = num_blocks * plan_block_bytes(config), device_memory_bytes(config.device)
    if need > have:
        raise ValueError(
            f"num_kv_blocks={num_blocks}: a KV cache of {need / 2**30:.1f} GiB does not fit "
            f"in the {have / 2**30:.1f} GiB of {config.device}"
        )
