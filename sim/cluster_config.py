"""The simulated deployment's settings (`ClusterConfig`): pools, routing, each node's engine
limits, fail-over and KV tiers, validated once."""

from __future__ import annotations

from dataclasses import dataclass

from tandem.engine.transfer.prefill_failover import DecodeOptions


@dataclass(frozen=True)
class ClusterConfig:
    """The deployment: pool sizes and TP per role, routing, the remote-prefill threshold,
    and each node's engine limits. `num_prefill == 0` is an aggregated deployment (decode
    nodes prefill everything themselves). `num_kv_blocks` None: as many as fit the device.
    The decode nodes' fail-over settings are `DecodeOptions`' (`failover`). Every node, of
    either role, gets the same lower KV tiers (`kv_host_blocks`, `kv_disk_blocks` under it;
    0: none), as `tandem serve --kv-host-gib` gives them; like the engine, tiers need TP 1."""

    num_prefill: int = 1
    num_decode: int = 1
    policy: str = "kv-aware"
    remote_prefill_threshold: int = 0
    tp_prefill: int = 1
    tp_decode: int = 1
    block_size: int = 16
    num_kv_blocks: int | None = None
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    max_model_len: int = 8192
    on_prefill_failure: str = "recompute"  # or "fail"
    prefill_timeout_s: float = 30.0
    hold_timeout_s: float = 120.0
    kv_host_blocks: int = 0
    kv_disk_blocks: int = 0

    def __post_init__(self) -> None:
        if self.num_decode < 1 or self.num_prefill < 0:
            raise ValueError("a deployment needs a decode node (and no negative prefill count)")
        if self.remote_prefill_threshold < 0:
            raise ValueError("remote_prefill_threshold must be >= 0")
        self.failover  # noqa: B018 -- checks the policy and the timeouts
        self._check_tiers()

    def _check_tiers(self) -> None:
        """As the engine refuses them (`EngineArgs`, `CacheConfig`)."""
        if self.kv_host_blocks < 0 or self.kv_disk_blocks < 0:
            raise ValueError("KV tier sizes must be >= 0 blocks")
        if self.kv_disk_blocks and not self.kv_host_blocks:
            raise ValueError("a disk KV tier sits under a host tier: give the host tier too")
        tp_sizes = (self.tp_decode, self.tp_prefill if self.num_prefill else 1)
        if self.kv_host_blocks and tp_sizes != (1, 1):
            raise ValueError("KV tiers need tensor parallel size 1 for now, as the engine")

    @property
    def failover(self) -> DecodeOptions:
        return DecodeOptions(
            self.remote_prefill_threshold,
            self.on_prefill_failure,
            self.prefill_timeout_s,
            self.hold_timeout_s,
        )

    @property
    def num_devices(self) -> int:
        return self.num_prefill * self.tp_prefill + self.num_decode * self.tp_decode
