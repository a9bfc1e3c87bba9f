"""The benchmark client that replays requests on a real `tandem serve` at their arrival
times, made light so that what it measures is the deployment, as the simulation has it:

- requests start in the list's order at their arrival times (`at_arrivals`): a burst (most
  of the Mooncake slice arrives at the same millisecond as the request before) reaches
  the router in the trace's order. A task per request sleeping until its own arrival woke
  in the timer heap's order instead, different from run to run.
- bodies are encoded before the clock starts: encoding a burst's prompts (up to a thousand
  token ids each) ran before the burst's first request went out, a few milliseconds.
- connections are opened before the clock starts (`warm_connections`, one per request
  that can be in flight) and kept between bursts (`KEEPALIVE_S`, less than the router's
  `--timeout-keep-alive`): with httpx's defaults (5 s) a burst after a pause opened new
  connections, and a request on a new one went out some 10 ms after those on open ones.
- the connections are the router's own `ClientShards`: one `httpx.AsyncClient` holding 64
  connections spent 265 ms of CPU sending a burst of 16 (its pool scans every connection
  per request), and the burst's last request left a quarter of a second late.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import httpx
from silent_server import SilentServer

from tandem.router.http_pool import ClientShards
from tandem.sim.workload import SimRequest

KEEPALIVE_S = 60.0  # the router keeps an idle connection 75 s
MAX_WARM_CONNECTIONS = 64
T = TypeVar("T")


def http_client() -> ClientShards:
    def client(limits: httpx.Limits) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=httpx.Timeout(600, connect=10), limits=limits)

    return ClientShards(client, KEEPALIVE_S)


async def warm_connections(http: ClientShards, base: str, n: int) -> str:
    """Open `n` connections to the router (as many requests at once); the model's id."""
    replies = await asyncio.gather(*(http.get(f"{base}/v1/models") for _ in range(n)))
    return replies[0].json()["data"][0]["id"]


async def at_arrivals(
    requests: list[SimRequest], one: Callable[[SimRequest], Awaitable[T]]
) -> list[T]:
    """`one(r)` for each request, started at its arrival time (relative to the first
    request's) and in the list's order; the results in that order."""
    start, t0, tasks = time.perf_counter(), requests[0].arrival_s, []
    for r in requests:
        delay = r.arrival_s - t0 - (time.perf_counter() - start)
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(r)))
    return list(await asyncio.gather(*tasks))


def _body(model: str, r: SimRequest, max_tokens: int) -> bytes:
    body = {
        "model": model, "prompt": r.token_ids(), "max_tokens": max_tokens,
        "temperature": 0, "ignore_eos": True, "stream": True,
    }  # fmt: skip
    return json.dumps(body).encode()


async def replay(
    base: str, requests: list[SimRequest], on_start: Callable[[], None] = lambda: None
) -> tuple[list[dict], float]:
    """Send each request at its arrival time, streamed; per request TTFT, end to end,
    tokens, end (perf_counter), and the replay's duration. `on_start` is called once the
    connections are open and the bodies encoded, as the clock starts."""
    async with http_client() as http:
        model = await warm_connections(http, base, min(len(requests), MAX_WARM_CONNECTIONS))
        bodies = {id(r): _body(model, r, r.num_output_tokens) for r in requests}
        on_start()
        start = time.perf_counter()

        async def one(r: SimRequest) -> dict:
            sent = time.perf_counter()
            first, tokens = None, 0
            headers = {"content-type": "application/json"}
            async with http.stream(
                "POST", f"{base}/v1/completions", content=bodies[id(r)], headers=headers
            ) as resp:
                resp.raise_for_status()
                async for line in resp.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    if json.loads(line[6:]).get("choices"):
                        first = first or time.perf_counter()
                        tokens += 1
            done = time.perf_counter()
            return {"ttft": first - sent, "e2e": done - sent, "tokens": tokens, "end": done}

        results = await at_arrivals(requests, one)
        return results, max(r["end"] for r in results) - start


async def refused(
    base: str, requests: list[SimRequest], on_start: Callable[[], None] = lambda: None
) -> None:
    """Send each request at its arrival time with a `max_tokens` no context holds: the
    router parses it and answers 400 without forwarding it. `on_start` as in `replay`."""
    async with http_client() as http:
        model = await warm_connections(http, base, min(len(requests), MAX_WARM_CONNECTIONS))
        bodies = {id(r): _body(model, r, 1 << 30) for r in requests}
        on_start()

        async def one(r: SimRequest) -> None:
            headers = {"content-type": "application/json"}
            resp = await http.post(f"{base}/v1/completions", content=bodies[id(r)], headers=headers)
            assert resp.status_code == 400, resp.text

        await at_arrivals(requests, one)


async def unanswered(
    base: str,
    requests: list[SimRequest],
    server: SilentServer,
    on_start: Callable[[], None] = lambda: None,
    on_received: Callable[[], None] = lambda: None,
    bound_s: float = 60.0,
) -> None:
    """Send each request at its arrival time, streamed as `replay` sends them, to `base`,
    from which no answer comes: `server` itself, or a router that forwards to it. Returns
    once `server` has every body (`on_received` called then, before the requests are
    dropped); TimeoutError after `bound_s`. `on_start` as in `replay`."""
    target = server.num_posts + len(requests)
    async with http_client() as http:
        model = await warm_connections(http, base, min(len(requests), MAX_WARM_CONNECTIONS))
        bodies = {id(r): _body(model, r, r.num_output_tokens) for r in requests}
        on_start()

        async def one(r: SimRequest) -> None:
            headers = {"content-type": "application/json"}
            url = f"{base}/v1/completions"
            async with http.stream("POST", url, content=bodies[id(r)], headers=headers):
                pass  # never reached: no reply comes

        sending = asyncio.create_task(at_arrivals(requests, one))
        try:
            if not await asyncio.to_thread(server.wait_for_posts, target, bound_s):
                raise TimeoutError(f"the silent server had {server.num_posts}/{target} bodies")
            on_received()
        finally:
            sending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sending


async def sent_only(requests: list[SimRequest], bound_s: float = 60.0) -> float:
    """This thread's CPU seconds to send each request at its arrival time, streamed as
    `replay` sends them, to a server that reads them and never answers
    (`SilentServer`): from the clock's start (connections open, bodies encoded) until the
    server has every body. What the client does before a request reaches the router."""
    clock: list[float] = []

    def tick() -> None:
        clock.append(time.thread_time())

    with SilentServer() as server:
        await unanswered(server.base, requests, server, tick, tick, bound_s)
    return clock[1] - clock[0]
