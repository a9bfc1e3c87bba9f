"""What the router spends forwarding a request, from its routing decision until the body is
written to the decode worker: measured on a router of its own whose workers are silent
servers (`SilentServer` answering `/health` as a decode and as a prefill node). The decode
one holds every request it gets until the set's last is in, so the router's CPU until then
holds the parsing, the routing and the forwarding of each request and nothing after; then
it answers them all (one finished record each), so that the router's connections to it
go back to its pool and the next set is forwarded on open connections, as on a deployment.
Dropped instead, every set opened new connections and the router's pool grew by the
requests left hanging: 2.3-3.6 ms per request, varying from set to set, against 1.3 ms.

The simulator charges this work as a second turn of the router's event loop after the
decision (`host_router_forward_s`): in the real router the decision and the write to the
decode worker are separate steps of the request's task, and what the loop took up
meanwhile (the next requests of a burst, KV events) runs between them.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

from local_serve import wait_ready
from proc_stats import thread_seconds
from replay_client import refused, replay
from silent_server import SilentServer

from tandem.engine.api.ports import free_port
from tandem.sim.workload import SimRequest

# What the silent servers answer `GET /health` with: the router takes them as a node of
# each role (no `events_port`: it subscribes to no KV events).
DECODE_HEALTH = {"role": "decode", "agent": "silent-decode"}
PREFILL_HEALTH = {"role": "prefill", "agent": "silent-prefill", "zmq_port": 1}
# A decode node's last record for a one-token request: what the held requests end with.
FINISHED = {
    "token_ids": [1], "text": "x", "logprobs": None, "finish_reason": "length",
    "stop_reason": None, "usage": {"prompt_tokens": 320, "completion_tokens": 1},
}  # fmt: skip


@contextmanager
def silent_router(model: str, router_args: list[str]) -> Iterator[tuple[str, int, SilentServer]]:
    """A router (`tandem.router`, `router_args` added) whose one decode and one prefill
    worker are silent servers, ready: its base URL, its pid, and the decode server."""
    with ExitStack() as stack:
        health, finished = json.dumps(DECODE_HEALTH), json.dumps(FINISHED) + "\n"
        decode = stack.enter_context(
            SilentServer(get_body=health.encode(), post_reply=finished.encode())
        )
        prefill = stack.enter_context(SilentServer(get_body=json.dumps(PREFILL_HEALTH).encode()))
        port = free_port()
        command = [
            sys.executable, "-P", "-m", "tandem.router", "--model", model, "--port", str(port),
            *router_args, "--decode", decode.base, "--prefill", prefill.base,
        ]  # fmt: skip
        log = stack.enter_context(tempfile.TemporaryFile())
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=log)
        try:
            base = f"http://127.0.0.1:{port}"
            wait_ready(base, proc, log, 2)
            yield base, proc.pid, decode
        finally:
            proc.kill()  # its requests to the silent worker never end: no graceful stop
            proc.wait(60)


def forward_cpu(
    model: str, router_args: list[str], num_requests: int = 24, repeat: int = 5
) -> float:
    """The router's CPU per request to route and forward it beyond what parsing it costs:
    a set of `num_requests` prompts (320 tokens, 0.05 s apart, as `relay_probe`'s)
    forwarded to the silent decode worker, less the same set refused after parsing
    (`max_tokens` beyond the context), each per request beyond a set of one; the median
    of `repeat` rounds (one set differs from the next by a collection of the router's
    garbage or a health round, 10-20 ms)."""
    with silent_router(model, router_args) as (base, pid, decode):

        def cpu_of(n: int, forward: bool) -> float:
            requests = [
                SimRequest.of_tokens(f"fwd{forward:d}-{n}-{i}", 0.05 * i, [11 + i % 7] * 320, 1)
                for i in range(n)
            ]
            clock: list[float] = []

            def tick() -> None:
                clock.append(thread_seconds(pid, 0)["router"])

            if forward:
                asyncio.run(forwarded(base, requests, decode, tick))
            else:
                asyncio.run(refused(base, requests, tick))
                tick()
            return clock[1] - clock[0]

        def beyond_one(forward: bool) -> float:
            return cpu_of(num_requests, forward) - cpu_of(1, forward)

        beyond_one(True)  # not counted: the first round opens the connections, warms up
        rounds = [beyond_one(True) - beyond_one(False) for _ in range(repeat)]
        return max(0.0, statistics.median(rounds) / (num_requests - 1))


async def forwarded(
    base: str,
    requests: list[SimRequest],
    decode: SilentServer,
    tick: Callable[[], None],
    bound_s: float = 60.0,
) -> None:
    """Replay `requests` through the router at `base` to `decode`, which holds them:
    `tick()` as the clock starts and once `decode` has every body (then it answers them
    and the replay ends)."""
    target = decode.num_posts + len(requests)

    async def answer_when_all_in() -> None:
        if not await asyncio.to_thread(decode.wait_for_posts, target, bound_s):
            raise TimeoutError(f"the silent decode worker had {decode.num_posts}/{target}")
        tick()
        decode.release()

    await asyncio.gather(replay(base, requests, tick), answer_when_all_in())
