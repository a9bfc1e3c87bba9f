"""The router's HTTP client against one `httpx.AsyncClient`: the client's CPU per streamed
request with many connections open, as a router holds with many streams in flight.

    python -P bench/http_pool.py [--rounds 20] [--smoke]

A local uvicorn server (in a thread of this process) answers `POST /g` with a one-line
stream. First `open` requests at once open that many connections; then `rounds` bursts of
`burst` streamed requests at once; the figure is the main thread's CPU (`time.thread_time`:
the server's thread is not counted) per request of the bursts.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from pathlib import Path

import httpx
import uvicorn
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe_host

from tandem.engine.api.ports import free_port
from tandem.router.http_pool import ClientShards


def app() -> FastAPI:
    api = FastAPI()

    @api.post("/g")
    async def g() -> StreamingResponse:
        async def body():
            yield b"x\n"

        return StreamingResponse(body())

    return api


def serve(port: int) -> uvicorn.Server:
    server = uvicorn.Server(
        uvicorn.Config(app(), port=port, log_level="error", timeout_keep_alive=120)
    )
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.01)
    return server


def single(limits: httpx.Limits) -> httpx.AsyncClient:
    return httpx.AsyncClient(limits=limits)


async def cpu_per_request(kind: str, url: str, open_: int, burst: int, rounds: int) -> float:
    """Seconds of this thread's CPU per request of the bursts."""
    if kind == "httpx":
        limits = httpx.Limits(max_connections=None, keepalive_expiry=120)
        http = httpx.AsyncClient(limits=limits)
    else:
        http = ClientShards(single, keepalive_s=120)
    async with http:

        async def one() -> None:
            async with http.stream("POST", f"{url}/g", content=b"{}") as r:
                async for _ in r.aiter_lines():
                    pass

        await asyncio.gather(*(one() for _ in range(open_)))
        start = time.thread_time()
        for _ in range(rounds):
            await asyncio.gather(*(one() for _ in range(burst)))
        return (time.thread_time() - start) / (rounds * burst)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--smoke", action="store_true", help="one small case of each")
    args = p.parse_args()
    cases = [(1, 1), (16, 16), (64, 16), (64, 64), (256, 16), (256, 64)]
    if args.smoke:
        cases, args.rounds = [(4, 4)], 2
    port = free_port()
    server = serve(port)
    print(f"command: python -P bench/http_pool.py {' '.join(sys.argv[1:])}")
    print(f"machine: {describe_host()}")
    print("open  burst  httpx.AsyncClient  ClientShards (ms of client CPU per request)")
    for open_, burst in cases:
        ms = [
            1e3 * asyncio.run(cpu_per_request(k, f"http://127.0.0.1:{port}", open_, burst,
                                              args.rounds))
            for k in ("httpx", "shards")
        ]  # fmt: skip
        print(f"{open_:4d}  {burst:5d}  {ms[0]:17.2f}  {ms[1]:12.2f}", flush=True)
    server.should_exit = True


if __name__ == "__main__":
    main()
