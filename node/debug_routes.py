"""A node's debug views (`/debug/kv`, `/debug/steps`, `/debug/blocks`): for tests,
benchmarks and an operator at the node's port, off unless the node is started with
`--debug-endpoints` (docs/security.md "Debug endpoints"). `/debug/kv` checks every KV
invariant on the engine thread (O(blocks)), and `/debug/blocks` returns raw KV bytes:
neither belongs on a port that anything in the cluster can reach."""

from __future__ import annotations

import base64
import dataclasses
from typing import TYPE_CHECKING

import torch
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException

if TYPE_CHECKING:
    from tandem.node.core import NodeCore
    from tandem.node.server import NodeServer

# Hashes one `/debug/blocks` call may ask for: a block of an 8B model (16 tokens, 32
# layers, 8 KV heads of 128, bf16) is 2 MiB, so 32 of them are a 64 MiB answer at most.
MAX_BLOCK_HASHES = 32

_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


class BlocksQuery(BaseModel):
    hashes: list[int] = Field(max_length=MAX_BLOCK_HASHES)


def add_debug_routes(server: NodeServer, enabled: bool) -> None:
    """The debug routes on `server.app` when `enabled`; otherwise every `/debug/...` path
    answers 404 in the API's error shape, saying how to turn them on."""
    if enabled:
        _add_views(server)
        return

    @server.app.api_route("/debug/{path:path}", methods=_METHODS)
    async def off(path: str) -> Response:
        raise HTTPException(404, "debug endpoints are off (start the node with --debug-endpoints)")


def _add_views(server: NodeServer) -> None:
    app = server.app

    @app.get("/debug/kv")
    async def debug_kv() -> Response:
        """The KV census, after checking every invariant (AssertionError: a 500)."""
        if (busy := server.not_ready()) is not None:
            return busy
        role = server.role
        return JSONResponse(await server.call(lambda: kv_report(role.core) | role.debug_report()))

    @app.get("/debug/steps")
    async def debug_steps(since: int = 0) -> Response:
        """The logged engine steps after step `since`, and the last step's number
        (`engine/telemetry/step_log.py`)."""
        if (busy := server.not_ready()) is not None:
            return busy
        log = server.role.core.steps
        steps, last = await server.call(lambda: (log.since(since), log.last_seq))
        return JSONResponse({"last": last, "steps": steps})

    @app.post("/debug/blocks")
    async def debug_blocks(query: BlocksQuery) -> Response:
        """Raw bytes (base64) of the cached blocks with these hashes, at most
        MAX_BLOCK_HASHES of them (400 over it); missing ones are left out."""
        if (busy := server.not_ready()) is not None:
            return busy
        found = await server.call(lambda: blocks_by_hash(server.role.core, query.hashes))
        return JSONResponse({str(h): base64.b64encode(b).decode() for h, b in found.items()})


def kv_report(core: NodeCore) -> dict[str, object]:
    """Check every KV invariant (AssertionError if one fails) and return the census."""
    counts = core.kv.check_integrity()
    return {
        "agent": core.agent.name,
        "free": counts.free,
        "cached": counts.cached,
        "in_use": counts.in_use,
        "total": counts.total,
        "held": core.kv.num_held_blocks,
        "holds": core.kv.hold_keys(),
        "requests": core.scheduler.num_unfinished,
        "rank_writes_in_flight": core.agent.census(),
        "rank_pids": core.runner.workers.pids if core.runner.workers else [],
        "tiers": {
            name: dataclasses.asdict(c)
            for name, c in (core.kv.tiers.counts().items() if core.kv.tiers else ())
        },
        "tier_copies_in_flight": core.copies_in_flight,
    }


def blocks_by_hash(core: NodeCore, hashes: list[int]) -> dict[int, bytes]:
    """Raw bytes of the cached blocks with these hashes (missing ones left out)."""
    found = {}
    for block_hash in hashes:
        block = core.kv.pool.get_cached_block(block_hash)
        if block is not None:
            data = core.runner.kv_cache[block.block_id].contiguous().cpu()
            found[block_hash] = data.view(-1).view(torch.uint8).numpy().tobytes()
    return found
