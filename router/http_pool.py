"""An HTTP client for many concurrent streams: httpx clients of a bounded number of
connections each, each request on the first client with a free place.

Why not one `httpx.AsyncClient`: its connection pool (httpcore 1.0) scans every connection
it holds, and counts them once per idle one, each time a request is queued or a response
closes, so a request's cost grows with the square of the connections held. Measured here
(`bench/http_pool.py`): 0.7 ms of the client's CPU per request with one connection open,
2.4 with 64, 16 with 256, and 44 ms with 256 open and bursts of 16 — a router with 256
streams in flight spent more on its pool than on everything else. Shards of `shard_size`
connections bound that scan; connections stay open between bursts (`keepalive_s`), so a
burst after a pause does not wait for new ones.

`stream` and `post` take the arguments of `httpx.AsyncClient`'s.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx

SHARD_SIZE = 16


class ClientShards:
    """httpx clients made by `make(limits)` on demand, at most `shard_size` requests in
    flight on each (so at most that many connections), the earliest-made shard first."""

    def __init__(
        self,
        make: Callable[[httpx.Limits], httpx.AsyncClient],
        keepalive_s: float,
        shard_size: int = SHARD_SIZE,
    ) -> None:
        if shard_size < 1:
            raise ValueError("shard_size must be at least 1")
        self._make = make
        self._limits = httpx.Limits(
            max_connections=None,  # the leases bound them; a cap would make requests wait
            max_keepalive_connections=shard_size,
            keepalive_expiry=keepalive_s,
        )
        self.shard_size = shard_size
        self.shards: list[httpx.AsyncClient] = []
        self.in_flight: list[int] = []  # requests in flight, per shard
        self.closed = False

    @contextlib.asynccontextmanager
    async def lease(self) -> AsyncIterator[httpx.AsyncClient]:
        """A shard with a free place, held for the block. RuntimeError once closed (as a
        closed `httpx.AsyncClient`): nothing is opened after `aclose`."""
        if self.closed:
            raise RuntimeError("the HTTP client has been closed")
        index = next((i for i, n in enumerate(self.in_flight) if n < self.shard_size), None)
        if index is None:
            index = len(self.shards)
            self.shards.append(self._make(self._limits))
            self.in_flight.append(0)
        self.in_flight[index] += 1
        try:
            yield self.shards[index]
        finally:
            self.in_flight[index] -= 1

    @contextlib.asynccontextmanager
    async def stream(self, method: str, url: str, **kwargs: Any) -> AsyncIterator[httpx.Response]:
        async with self.lease() as client, client.stream(method, url, **kwargs) as response:
            yield response

    async def post(self, url: str, **kwargs: Any) -> httpx.Response:
        async with self.lease() as client:
            return await client.post(url, **kwargs)

    async def get(self, url: str, **kwargs: Any) -> httpx.Response:
        async with self.lease() as client:
            return await client.get(url, **kwargs)

    async def aclose(self) -> None:
        self.closed = True
        for client in self.shards:
            await client.aclose()
        self.shards.clear()
        self.in_flight.clear()

    async def __aenter__(self) -> ClientShards:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
