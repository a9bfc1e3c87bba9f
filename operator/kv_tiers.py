"""`spec.<pool>.kvTiers`: the lower tiers of a prefill or decode pool's KV cache, read once,
and what they add to the pool's pods.

Blocks evicted from the device pool go to host memory (`host`) and, from there, optionally
to a file on a local disk (`disk`). The engine is told the sizes by flags (`--kv-host-gib`,
`--kv-disk-gib`, `--kv-disk-dir`); the pod must hold them too:

- the host tier is memory the engine allocates at start-up, so its size is added to the
  container's memory request and limit where the user set them, and is the memory request
  where the user set neither (so the scheduler places the pod where that memory is free;
  no limit is invented);
- the disk tier's file lives in a volume mounted at KV_DISK_DIR, writable under the
  read-only root filesystem: an emptyDir whose sizeLimit is the tier's size by default, or
  the user's volume source. An emptyDir is node-local ephemeral storage, so its size is
  added to `ephemeral-storage` the same way.

A size of 0 means no tier, as for the flags. The tiers do not change the revision: a pod
with or without them holds and ships the same KV blocks, so they only roll the pool.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from tandem.operator.hardening import SecurityOverrides
from tandem.operator.names import KV_DISK_DIR, KV_DISK_VOLUME
from tandem.operator.quantity import SIZE, format_bytes, format_gib, parse_bytes
from tandem.operator.reader import Reader

# Volume sources that cannot hold the disk tier, and why.
REFUSED_VOLUMES = {
    **dict.fromkeys(
        ("configMap", "secret", "downwardAPI", "projected"),
        "is mounted read-only: the disk tier writes its file there",
    ),
    "persistentVolumeClaim": "would be one claim shared by every pod of the pool: use an "
    "ephemeral volume (a claim per pod) or an emptyDir",
}


@dataclass(frozen=True)
class DiskTier:
    """`size` as the user wrote it (a quantity); `volume` a core/v1 VolumeSource."""

    size: str
    volume: dict[str, Any]

    @property
    def num_bytes(self) -> int:
        return parse_bytes(self.size)

    @property
    def ephemeral(self) -> bool:
        """An emptyDir: the node's ephemeral storage holds it."""
        return "emptyDir" in self.volume


@dataclass(frozen=True)
class KVTiers:
    """A pool's tiers below the device: none by default."""

    host_size: str = "0"
    disk: DiskTier | None = None

    @property
    def host_bytes(self) -> int:
        return parse_bytes(self.host_size)


def read_kv_tiers(pool: Reader, security: SecurityOverrides) -> KVTiers:
    """Read `<pool>.kvTiers`, and check that the pool's memory and ephemeral-storage, which
    the tiers add to, are quantities. Raises ValueError naming the first refused field."""
    tiers_at = pool.child("kvTiers")
    host = tiers_at.child("host")
    tiers = KVTiers(
        host_size=_size(host) if host.present else "0",
        disk=_disk(tiers_at.child("disk"), pool, security),
    )
    if tiers.disk is not None and not tiers.host_bytes:
        raise tiers_at.error("the disk tier sits under a host tier: give host.size too", "disk")
    resources = pool.child("resources")
    if tiers.host_bytes:
        _check_quantities(resources, "memory")
    if tiers.disk is not None and tiers.disk.ephemeral:
        _check_quantities(resources, "ephemeral-storage")
    return tiers


def kv_tier_args(tiers: KVTiers) -> list[str]:
    """The engine's flags for the tiers; none without tiers."""
    args = []
    if tiers.host_bytes:
        args += ["--kv-host-gib", format_gib(tiers.host_bytes)]
    if tiers.disk is not None:
        args += ["--kv-disk-gib", format_gib(tiers.disk.num_bytes), "--kv-disk-dir", KV_DISK_DIR]
    return args


def kv_tier_volumes(tiers: KVTiers) -> list[dict[str, Any]]:
    if tiers.disk is None:
        return []
    return [{"name": KV_DISK_VOLUME, **copy.deepcopy(tiers.disk.volume)}]


def kv_tier_mounts(tiers: KVTiers) -> list[dict[str, Any]]:
    return [{"name": KV_DISK_VOLUME, "mountPath": KV_DISK_DIR}] if tiers.disk is not None else []


def add_kv_tier_resources(resources: dict[str, Any], tiers: KVTiers) -> None:
    """Add the tiers' memory and ephemeral storage to a container's `resources` (mutated)."""
    if tiers.host_bytes:
        _add(resources, "memory", tiers.host_bytes)
    if tiers.disk is not None and tiers.disk.ephemeral:
        _add(resources, "ephemeral-storage", tiers.disk.num_bytes)


def _size(tier: Reader) -> str:
    return tier.string("size", required=True, pattern=SIZE)


def _disk(disk: Reader, pool: Reader, security: SecurityOverrides) -> DiskTier | None:
    if not disk.present:
        return None
    size = _size(disk)
    if not parse_bytes(size):
        return None
    volume = disk.mapping("volume") or {"emptyDir": {"sizeLimit": size}}
    _check_volume(disk, volume, pool, security)
    return DiskTier(size, copy.deepcopy(volume))


def _check_volume(
    disk: Reader, volume: dict[str, Any], pool: Reader, security: SecurityOverrides
) -> None:
    """One writable volume source per pod; a hostPath only where the pool allows it."""
    if len(volume) != 1 or not isinstance(next(iter(volume.values())), dict):
        raise disk.error("must be one volume source, such as {emptyDir: {}}", "volume")
    (kind,) = volume
    at = f"volume.{kind}"
    if kind == "name":
        raise disk.error(f"the volume is named {KV_DISK_VOLUME} by the operator", at)
    if kind in REFUSED_VOLUMES:
        raise disk.error(REFUSED_VOLUMES[kind], at)
    if kind == "hostPath" and not security.host_path_volumes:
        allow = f"{pool.path}.podTemplate.securityOverrides.hostPathVolumes"
        raise disk.error(
            f"a hostPath volume weakens the hardened defaults: allow it with {allow}", at
        )
    if kind == "emptyDir" and volume[kind].get("medium") == "Memory":
        raise disk.error("a memory-backed emptyDir is host memory: size the host tier", at)


def _check_quantities(resources: Reader, name: str) -> None:
    for part in ("requests", "limits"):
        value = resources.mapping(part).get(name)
        if value is None:
            continue
        try:
            parse_bytes(value)
        except ValueError:
            raise resources.error(f"must be a quantity, got {value!r}", f"{part}.{name}") from None


def _add(resources: dict[str, Any], name: str, num_bytes: int) -> None:
    """Add to the request and the limit that are set, or request `num_bytes` if neither is."""
    parts = [p for p in ("requests", "limits") if name in resources.get(p, {})] or ["requests"]
    for part in parts:
        section = resources.setdefault(part, {})
        section[name] = format_bytes(parse_bytes(section.get(name, 0)) + num_bytes)
