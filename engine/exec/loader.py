"""The safetensors loader: single-file and sharded checkpoints, names mapped by the model's
`packed_modules` table, every parameter accounted for.

Tensors are opened lazily (`get_slice`): a parameter with a `weight_loader` reads only its
slice (a tensor-parallel rank's rows or columns), any other reads the whole tensor.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn


def checkpoint_files(model_dir: str | Path) -> list[Path]:
    """The safetensors files of a checkpoint: those named by `model.safetensors.index.json`
    when present, else every `*.safetensors`. Raises OSError when there are none or one named
    by the index is missing."""
    root = Path(model_dir)
    index = root / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [root / name for name in names]
        for f in files:
            if not f.is_file():
                raise OSError(f"weight file {f.name} named by {index.name} is missing in {root}")
        return files
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise OSError(f"no *.safetensors weight files in {root}")
    return files


def iterate_slices(model_dir: str | Path) -> Iterator[tuple[str, Any]]:
    """(name, lazy tensor) for every checkpoint tensor; indexing a lazy tensor reads only
    the bytes asked for. Valid until the next item."""
    for path in checkpoint_files(model_dir):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                yield name, f.get_slice(name)


def load_weights(model: nn.Module, model_dir: str | Path) -> None:
    """Copy every checkpoint tensor into `model`'s parameters.

    Raises ValueError naming the tensor for an unexpected name or a shape mismatch, and
    naming the parameters left unloaded when any is missing.
    """
    params = dict(model.named_parameters())
    packed: dict[str, tuple[str, str | int]] = getattr(model, "packed_modules", {})
    ignored: tuple[str, ...] = getattr(model, "ignored_suffixes", ())
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    loaded: set[tuple[str, object]] = set()
    for name, source in iterate_slices(model_dir):
        if name.endswith(ignored) or (tied and name == "lm_head.weight"):
            continue
        target, shard = _map_name(name, packed)
        param = params.get(target)
        if param is None:
            raise ValueError(f"unexpected tensor {name!r} in checkpoint {model_dir}")
        try:
            _load_one(param, source, shard)
        except ValueError as e:
            raise ValueError(f"tensor {name!r}: {e}") from None
        loaded.add((target, shard))
    missing = [
        f"{name}[{shard}]" if shard is not None else name
        for name, param in params.items()
        for shard in getattr(param, "shard_ids", (None,))
        if (name, shard) not in loaded
    ]
    if missing:
        raise ValueError(f"checkpoint {model_dir} lacks tensors for: {', '.join(missing)}")


def _map_name(name: str, packed: dict[str, tuple[str, str | int]]) -> tuple[str, str | int | None]:
    for fragment, (fused, shard) in packed.items():
        if f".{fragment}." in name:
            return name.replace(f".{fragment}.", f".{fused}."), shard
    return name, None


def _load_one(param: nn.Parameter, source: Any, shard: str | int | None) -> None:
    with torch.no_grad():
        loader = getattr(param, "weight_loader", None)
        if loader is not None:
            loader(param, source, shard)
            return
        shape = tuple(source.get_shape())
        if shape != tuple(param.shape):
            raise ValueError(f"shape {shape} != expected {tuple(param.shape)}")
        param.data.copy_(source[:])
