"""Readers of the production traces in `/work/shared/traces` (see its README): Mooncake's
jsonl (arrival in ms, lengths, and one hash id per 512-token block: equal ids are equal
blocks) and the Azure LLM inference csv (timestamps and lengths; no sharing information).

`length_scale` shrinks a trace for small models: lengths are divided by it, and so are
Mooncake's 512-token blocks, so the sharing structure is kept.
"""

from __future__ import annotations

import csv
import json
from datetime import datetime
from pathlib import Path

from tandem.sim.workload import SimRequest, private_segments

MOONCAKE_BLOCK_TOKENS = 512


def read_trace(
    path: str | Path,
    vocab_size: int,
    max_requests: int | None = None,
    length_scale: float = 1.0,
    seed: int = 0,
) -> list[SimRequest]:
    """Mooncake (`.jsonl`) or Azure (`.csv`), by extension. Raises ValueError on a file of
    another kind or a malformed line."""
    path = Path(path)
    if length_scale < 1:
        raise ValueError("length_scale must be at least 1 (it shrinks lengths)")
    if path.suffix == ".jsonl":
        return _mooncake(path, vocab_size, max_requests, length_scale, seed)
    if path.suffix == ".csv":
        return _azure(path, vocab_size, max_requests, length_scale, seed)
    raise ValueError(f"{path}: unknown trace format (expected .jsonl or .csv)")


def _scaled(n: int, scale: float) -> int:
    return max(round(n / scale), 1)


def _mooncake(
    path: Path, vocab: int, max_requests: int | None, scale: float, seed: int
) -> list[SimRequest]:
    segment = max(round(MOONCAKE_BLOCK_TOKENS / scale), 1)
    requests = []
    with path.open() as f:
        for i, line in enumerate(f):
            if max_requests is not None and i >= max_requests:
                break
            try:
                row = json.loads(line)
                arrival = row["timestamp"] / 1000.0
                n_in, n_out = _scaled(row["input_length"], scale), row["output_length"]
                hash_ids = tuple(int(h) for h in row["hash_ids"])
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{i + 1}: not a Mooncake trace line: {exc}") from exc
            n_in = min(n_in, len(hash_ids) * segment) if hash_ids else n_in
            n_out = _scaled(n_out, scale)
            requests.append(
                SimRequest(f"mc-{i}", arrival, n_in, n_out, hash_ids, segment, vocab, seed)
            )
    return requests


def _azure(
    path: Path, vocab: int, max_requests: int | None, scale: float, seed: int
) -> list[SimRequest]:
    requests = []
    start: datetime | None = None
    with path.open(newline="") as f:
        for i, row in enumerate(csv.DictReader(f)):
            if max_requests is not None and i >= max_requests:
                break
            try:
                # seven fractional digits: keep six for fromisoformat
                when = datetime.fromisoformat(row["TIMESTAMP"][:26])
                n_in = _scaled(int(row["ContextTokens"]), scale)
                n_out = _scaled(int(row["GeneratedTokens"]), scale)
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{i + 2}: not an Azure trace row: {exc}") from exc
            start = start or when
            arrival = (when - start).total_seconds()
            segments = private_segments(i, n_in, 16)
            requests.append(SimRequest(f"az-{i}", arrival, n_in, n_out, segments, 16, vocab, seed))
    return requests
