"""Stable chained hashes of full KV blocks, shared by the nodes and the router's prefix index.

A block's hash covers its parent's hash, its token ids and the extra keys (the node's model
revision, then the request's `cache_salt`), so equal hashes mean equal KV contents: blocks
computed by another revision of the model, or for another tenant, never match. SHA-256
truncated to 64 bits: stable across processes and machines, unlike Python's `hash`.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

BlockHash = int

_NO_PARENT = b"\xff" * 8


def hash_block(
    parent: BlockHash | None, token_ids: Sequence[int], extra_keys: Sequence[str] = ()
) -> BlockHash:
    """Hash one full block given its parent's hash (None for the first block)."""
    h = hashlib.sha256()
    h.update(_NO_PARENT if parent is None else parent.to_bytes(8, "little"))
    h.update(array("q", token_ids).tobytes())
    for key in extra_keys:
        h.update(b"\x00" + key.encode())
    return int.from_bytes(h.digest()[:8], "little")


def block_extra_keys(revision: str = "", cache_salt: str | None = None) -> tuple[str, ...]:
    """The extra keys of a request's first block, in the one order nodes and routers use."""
    return (*((revision,) if revision else ()), *((cache_salt,) if cache_salt else ()))


def hash_blocks(
    token_ids: Sequence[int],
    block_size: int,
    extra_keys: Sequence[str] = (),
    parent: BlockHash | None = None,
    start_block: int = 0,
) -> list[BlockHash]:
    """Hashes of the full blocks of `token_ids` from block `start_block` on.

    `parent` is the hash of block `start_block - 1` (None when starting at 0). The extra
    keys go into the first block only: its hash then flows down the chain.
    """
    hashes: list[BlockHash] = []
    for i in range(start_block, len(token_ids) // block_size):
        keys = extra_keys if i == 0 else ()
        parent = hash_block(parent, token_ids[i * block_size : (i + 1) * block_size], keys)
        hashes.append(parent)
    return hashes
