"""A KV-link profile fitted from measured NIXL writes (`bench/transfer.py --profile-out`).

Each point is one write: its blocks, its descriptors (runs of blocks adjacent on both
sides) and bytes, and its measured seconds. The transfer model's time of a write is
`latency + descriptors * descriptor_cost + bytes / bandwidth` (`sim/transfer_model.py`),
linear in (latency, descriptor_cost, 1/bandwidth); the fit is non-negative least squares
of the relative error, as the step-time calibration's. Writes of adjacent blocks alone
cannot tell a write's latency from its one descriptor: the bench also writes scattered
blocks (one descriptor each).

`tandem simulate` and `tandem plan` read the file with `--transfer-profile`; it replaces
the device profile's three KV-link constants.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from tandem.sim.calibration import nonnegative_lstsq
from tandem.sim.profiles import DeviceProfile


@dataclass(frozen=True)
class TransferPoint:
    num_blocks: int
    num_descriptors: int
    num_bytes: int
    seconds: float


@dataclass(frozen=True)
class TransferProfile:
    """The KV link's constants, where they came from, and the points they were fitted to."""

    kv_link_bandwidth: float  # bytes/s
    kv_transfer_latency_s: float  # per write
    kv_descriptor_s: float  # per descriptor
    source: str
    median_rel_error: float = 0.0
    points: tuple[TransferPoint, ...] = ()

    def __post_init__(self) -> None:
        if self.kv_link_bandwidth <= 0:
            raise ValueError("kv_link_bandwidth must be positive")
        if self.kv_transfer_latency_s < 0 or self.kv_descriptor_s < 0:
            raise ValueError("per-write and per-descriptor costs must be >= 0")

    def predict(self, num_descriptors: int, num_bytes: float) -> float:
        return (
            self.kv_transfer_latency_s
            + num_descriptors * self.kv_descriptor_s
            + num_bytes / self.kv_link_bandwidth
        )

    def apply(self, profile: DeviceProfile) -> DeviceProfile:
        """`profile` with this link's constants."""
        return dataclasses.replace(
            profile,
            kv_link_bandwidth=self.kv_link_bandwidth,
            kv_transfer_latency_s=self.kv_transfer_latency_s,
            kv_descriptor_s=self.kv_descriptor_s,
            source=f"{profile.source}; KV link: {self.source}",
        )

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2) + "\n")


def load_transfer_profile(path: str | Path) -> TransferProfile:
    """Raises ValueError for a missing file or one that is not a transfer profile."""
    try:
        raw = json.loads(Path(path).read_text())
        points = tuple(TransferPoint(**p) for p in raw.pop("points", ()))
        return TransferProfile(**raw, points=points)
    except (OSError, TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a transfer profile ({exc})") from exc


def fit_transfer(points: Sequence[TransferPoint], source: str) -> TransferProfile:
    """The constants that best predict `points` (relative error, all >= 0). Needs points
    of at least two sizes and two descriptor counts per size to tell the terms apart."""
    if len(points) < 3:
        raise ValueError(f"need at least 3 measured writes to fit 3 constants, got {len(points)}")
    a = np.asarray([[1.0, p.num_descriptors, p.num_bytes] for p in points])
    y = np.asarray([p.seconds for p in points])
    a = a / y[:, None]  # relative error: each row divided by its time
    scale = a.max(axis=0)
    latency, per_descriptor, per_byte = nonnegative_lstsq(a / scale, np.ones_like(y)) / scale
    if per_byte <= 0:
        raise ValueError("the points show no cost per byte: measure larger writes")
    fit = TransferProfile(1.0 / per_byte, float(latency), float(per_descriptor), source)
    errors = [abs(fit.predict(p.num_descriptors, p.num_bytes) / p.seconds - 1) for p in points]
    return dataclasses.replace(fit, median_rel_error=float(np.median(errors)), points=tuple(points))
