"""`bench/silent_server.py`, `replay_client.sent_only` and `forward_probe.silent_router`,
what `bench/sim_validate.py`'s probes measure a client's sending and the router's
forwarding with: every POST body is read and none is answered, GETs are, and the CPU is
counted until the last body is in."""

from __future__ import annotations

import asyncio
import sys
import threading

import httpx
import pytest

from tests.bench_run import BENCH
from tests.bounds import PROCESS_S

sys.path.insert(0, str(BENCH))

from forward_probe import forwarded, silent_router
from replay_client import sent_only
from silent_server import SilentServer

from tandem.sim.workload import SimRequest


def test_posts_are_read_to_the_end_and_never_answered():
    counts: list[int] = []
    all_in = threading.Event()

    def on_post(n: int) -> None:
        counts.append(n)
        if n == 2:
            all_in.set()

    with SilentServer(on_post) as server, httpx.Client(timeout=PROCESS_S) as http:
        assert http.get(f"{server.base}/v1/models").json()["data"][0]["id"] == "silent"
        with httpx.Client(timeout=httpx.Timeout(PROCESS_S, read=0.2)) as poster:
            body = b'{"prompt": [1, 2, 3]}' * 1000  # more than one read
            for _ in range(2):
                with pytest.raises(httpx.ReadTimeout):  # no answer, ever
                    poster.post(f"{server.base}/v1/completions", content=body)
        assert all_in.wait(PROCESS_S)
    assert counts == [1, 2]
    assert server.post_paths == ["/v1/completions"] * 2


def test_sent_only_counts_cpu_until_every_body_is_in():
    requests = [SimRequest.of_tokens(f"s{i}", 0.01 * i, [5] * 64, 1) for i in range(3)]
    cpu = asyncio.run(sent_only(requests, bound_s=PROCESS_S))
    assert 0.0 < cpu < PROCESS_S


def test_held_posts_are_answered_on_release_and_their_connection_kept():
    with SilentServer(post_reply=b'{"done": true}\n') as server:
        timeout = httpx.Timeout(PROCESS_S, read=0.2)
        with httpx.Client(timeout=timeout) as http, pytest.raises(httpx.ReadTimeout):
            http.post(f"{server.base}/generate", content=b"{}")  # held: no answer yet
        with httpx.Client(timeout=PROCESS_S) as http:
            answers = []
            thread = threading.Thread(
                target=lambda: answers.append(http.post(f"{server.base}/generate", content=b"{}"))
            )
            thread.start()
            assert server.wait_for_posts(2, PROCESS_S)
            server.release()
            thread.join(PROCESS_S)
            assert answers[0].json() == {"done": True}
            # the same connection takes the next request
            assert http.get(f"{server.base}/v1/models").status_code == 200


def test_a_router_forwards_each_request_to_its_silent_decode_worker(llama_dir):
    # The router takes the silent servers for a decode and a prefill node (their /health)
    # and routes every request to the decode one, which holds them until the set's last is
    # in, then ends each with one finished record: the client's streams end, twice over.
    requests = [SimRequest.of_tokens(f"f{i}", 0.01 * i, [5] * 64, 1) for i in range(3)]
    ticks: list[int] = []
    with silent_router(str(llama_dir), ["--log-level", "warning"]) as (base, _pid, decode):
        for _ in range(2):
            asyncio.run(forwarded(base, requests, decode, lambda: ticks.append(decode.num_posts)))
        assert decode.post_paths == ["/generate"] * 6
    assert ticks == [0, 3, 3, 6]  # the clock starts before any body, stops after the set
