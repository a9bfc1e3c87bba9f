"""`bench/silent_server.py` and `replay_client.sent_only`, what `bench/sim_validate.py`'s
probe measures a client's sending with: every POST body is read and none is answered, GETs
are, and the sender's CPU is counted until the last body is in."""

from __future__ import annotations

import asyncio
import sys
import threading

import httpx
import pytest

from tests.bench_run import BENCH
from tests.bounds import PROCESS_S

sys.path.insert(0, str(BENCH))

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


def test_sent_only_counts_cpu_until_every_body_is_in():
    requests = [SimRequest.of_tokens(f"s{i}", 0.01 * i, [5] * 64, 1) for i in range(3)]
    cpu = asyncio.run(sent_only(requests, bound_s=PROCESS_S))
    assert 0.0 < cpu < PROCESS_S
