"""Every boundary holds: hypothesis-drawn messages at every port of one running prefill and
decode pair (HTTP on both, the prefill worker's ROUTER, both KV-event PUB sockets, the
decode node's DEALER through a fake prefill worker, and NIXL notifications), each port
with well-formed messages mutated and raw junk. After each port both nodes are alive, every
HTTP answer was a success or a 4xx in the API's error shape, every ZMQ refusal was counted,
and no KV block is left taken on either node (`tests/disagg/fuzz_ports.py`)."""

from __future__ import annotations

import httpx
import pytest

from tandem.engine.api.deployment_token import ENV as TOKEN_ENV
from tandem.engine.api.deployment_token import DeploymentToken
from tests.bounds import HANG_S
from tests.disagg.fuzz_ports import (
    FakePrefill,
    Sender,
    Tally,
    assert_alive,
    assert_no_block_leaked,
    fuzz_decode_replies,
    fuzz_http,
    fuzz_prefill_router,
    fuzz_pub,
    fuzz_raw,
    remote_body,
)
from tests.disagg.nodes import Node, running

EXAMPLES = 40  # per port: a CI-sized run; `bench/fuzz_nodes.py` draws more
# Short deadlines: a request the fake prefill worker leaves unanswered fails over, and the
# hold of an abandoned attempt it never confirms ends, within the test.
FLAGS = ("--max-num-batched-tokens", "256", "--max-model-len", "512", "--num-kv-blocks", "64")
DECODE_FLAGS = (*FLAGS, "--prefill-timeout", "5", "--hold-timeout", "10")


# The deployment's token: the pair holds it, and so does the fuzzer (a peer inside the
# deployment, which can reach past the token check); its calls sometimes replace it.
TOKEN = DeploymentToken("the-fuzzed-deployment-0123456789")


@pytest.fixture(scope="module")
def pair(llama_dir, node_logs):
    env = {TOKEN_ENV: TOKEN.value}
    nodes = {"prefill": Node("prefill", llama_dir, node_logs, *FLAGS, env=env),
             "decode": Node("decode", llama_dir, node_logs, *DECODE_FLAGS, env=env)}  # fmt: skip
    with running(nodes):
        yield nodes["prefill"], nodes["decode"]


@pytest.fixture(scope="module")
def sender():
    sender = Sender(TOKEN)
    yield sender
    sender.close()


@pytest.fixture(scope="module")
def fake(sender, pair):
    """A fake prefill worker that has heard from the decode node once (so it has the decode
    node's agent, and the decode node a connection to it)."""
    _, decode = pair
    fake = FakePrefill(sender)
    r = sender.send(decode.url, remote_body("hello", fake.endpoint))
    assert r.status_code == 200, r.read()
    got = fake.serve(wait_s=HANG_S)
    assert got is not None
    fake.refuse(*got)
    r.read()
    r.close()
    yield fake
    fake.close()


def events_port(node: Node) -> int:
    return httpx.get(f"{node.url}/health", timeout=HANG_S).json()["events_port"]


def test_http_at_the_decode_node(pair, sender, fake):
    prefill, decode = pair
    tally = Tally()
    fuzz_http(sender, decode, "decode http", [None, prefill.endpoint, fake.endpoint], tally,
              EXAMPLES)  # fmt: skip
    assert_alive(prefill, decode)
    assert_no_block_leaked(prefill, decode, fake=fake)
    assert sum(n for (_, o), n in tally.outcomes.items() if o.endswith(" 200")) > 0


def test_http_at_the_prefill_node(pair, sender, fake):
    prefill, decode = pair
    fuzz_http(sender, prefill, "prefill http", [None], Tally(), EXAMPLES)
    assert_alive(prefill, decode)
    assert_no_block_leaked(prefill, decode, fake=fake)


def test_http_at_the_metrics_ports(pair, sender, fake):
    prefill, decode = pair
    for node in pair:
        url = f"http://127.0.0.1:{node.metrics_port}"
        fuzz_http(sender, node, f"{node.role} metrics", [None], Tally(), EXAMPLES // 2, url)
    assert_alive(prefill, decode)
    assert_no_block_leaked(prefill, decode, fake=fake)


def test_frames_at_the_prefill_router(pair, sender, fake):
    """With the decode node's real agent among the ones drawn: its requests are prefilled
    and written (into free blocks), their notifications stray on the decode node."""
    prefill, decode = pair
    fuzz_prefill_router(sender, prefill, fake.decode_agents, Tally(), EXAMPLES)
    assert_alive(prefill, decode)
    assert_no_block_leaked(prefill, decode, fake=fake)


def test_replies_and_notifications_at_the_decode_node(pair, sender, fake):
    prefill, decode = pair
    fuzz_decode_replies(sender, decode, fake, Tally(), EXAMPLES // 2)
    fake.serve(wait_s=0.5)  # the last aborts, acknowledged
    assert_alive(prefill, decode)
    assert_no_block_leaked(prefill, decode, fake=fake)


def test_subscriptions_and_raw_bytes_at_every_port(pair, sender, fake):
    prefill, decode = pair
    for node in pair:
        fuzz_pub(sender, node, events_port(node), Tally(), EXAMPLES // 2)
    ports = {"prefill http": prefill.http_port, "prefill zmq": prefill.zmq_port,
             "prefill pub": events_port(prefill), "decode http": decode.http_port,
             "decode pub": events_port(decode), "prefill metrics": prefill.metrics_port,
             "decode metrics": decode.metrics_port}  # fmt: skip
    fuzz_raw(sender, ports, Tally(), EXAMPLES)
    assert_alive(prefill, decode)
    assert_no_block_leaked(prefill, decode, fake=fake)
