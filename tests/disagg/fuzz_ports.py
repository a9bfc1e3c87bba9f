"""Fuzzing a running prefill and decode pair at every port, for the tests and the bench.

`Sender` is the one place that knows how a message reaches a node (HTTP headers, ZMQ
socket setup): a deployment token or a first-contact handshake is one line there. Each
`fuzz_*` function sends one port its examples (drawn by hypothesis, reproducibly), checks
every answer it can see, and counts what it sent and what came back in a `Tally`.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import msgspec
import torch
import zmq
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tandem.engine.api.deployment_token import DeploymentToken
from tandem.engine.api.wire import HELLO_LABEL, WELCOME_LABEL, Fingerprint, Hello, Welcome
from tandem.engine.transfer.messages import (
    AbortAck,
    AbortPrefill,
    AgentInfo,
    PrefillFailed,
    PrefillRequest,
    decode_from_prefill,
    decode_to_prefill,
    encode,
)
from tandem.engine.transfer.nixl_agent import KVTransferAgent, new_agent_name
from tests.bounds import HANG_S
from tests.disagg import fuzz_inputs as fz
from tests.disagg.nodes import Node, metric_value, wait_until

STREAMS_OPEN = 2  # /generate streams left open while later messages arrive (replayed ids)


class Sender:
    """How a fuzz message reaches a node. `headers` go with every HTTP message (a token
    would); `dealer` and `xsub` make the ZMQ sockets a peer talks through (a handshake
    would go there)."""

    def __init__(self, token: DeploymentToken | None = None) -> None:
        self.token = token or DeploymentToken()
        self.headers = self.token.headers()  # a call's own `authorization` gives way
        self.http = httpx.Client(timeout=HANG_S)
        self.context = zmq.Context()

    def send(self, url: str, call: fz.HttpCall) -> httpx.Response:
        """The response, its body not yet read (a stream stays open until closed)."""
        headers = {"content-type": "application/json", **self.headers, **call.headers}
        request = self.http.build_request(call.method, url + call.path, headers=headers,
                                          content=call.body)  # fmt: skip
        return self.http.send(request, stream=True)

    def socket(self, kind: int, endpoint: str, bind: bool = False) -> zmq.Socket:
        sock = self.context.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(endpoint) if bind else sock.connect(endpoint)
        return sock

    def dealer(self, endpoint: str, fingerprint: Fingerprint | None = None) -> zmq.Socket:
        """A DEALER to a prefill node, paired with it as a decode node of `fingerprint`
        (the nodes run with authentication off: an empty token); unpaired without one."""
        sock = self.socket(zmq.DEALER, endpoint)
        if fingerprint is not None:
            nonce = os.urandom(16)
            sock.send(encode(Hello(fingerprint, nonce, self.token.proof(HELLO_LABEL, nonce))))
            assert sock.poll(HANG_S * 1000), "no answer to hello"
            assert isinstance(decode_from_prefill(sock.recv()), Welcome)
        return sock

    def welcome(self, hello: Hello, agent: str) -> Welcome:
        """What a prefill worker of the same deployment, whose NIXL agent is `agent`,
        answers a decode node's `hello`."""
        proof = self.token.proof(WELCOME_LABEL, hello.nonce)
        return Welcome(hello.fingerprint, hello.nonce, proof, agent)

    def xsub(self, endpoint: str) -> zmq.Socket:
        return self.socket(zmq.XSUB, endpoint)

    def raw(self, port: int, data: bytes) -> None:
        """Bytes on a plain TCP connection, below any protocol; the peer may hang up."""
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 5) as s:
            s.sendall(data)

    def close(self) -> None:
        self.http.close()
        self.context.destroy(0)


@dataclass
class Tally:
    """Messages sent per port, and what came back, by port and outcome."""

    sent: Counter = field(default_factory=Counter)
    outcomes: Counter = field(default_factory=Counter)

    def count(self, port: str, outcome: str, n: int = 1) -> None:
        self.sent[port] += n
        self.outcomes[port, outcome] += n


def drive(strategy: st.SearchStrategy, each: Callable, max_examples: int) -> None:
    """Call `each` on `max_examples` examples of `strategy`: the same ones every run (no
    database, derandomized), no shrinking (each example costs a round trip)."""

    @settings(max_examples=max_examples, deadline=None, derandomize=True, database=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck),
              print_blob=False)  # fmt: skip
    @given(strategy)
    def run(example) -> None:
        each(example)

    run()


def refused(node: Node, reason: str | None = None) -> float:
    labels = {"reason": reason} if reason else {}
    return metric_value(node.metrics(), "tandem_refused_inputs_total", **labels)


def fingerprint_of(node: Node) -> Fingerprint:
    """The node's, from its /health: what a peer must match to pair with it."""
    health = httpx.get(f"{node.url}/health", timeout=HANG_S).json()
    return msgspec.convert(health["fingerprint"], Fingerprint)


def assert_alive(*nodes: Node) -> None:
    for node in nodes:
        assert node.proc.poll() is None, f"{node.role} exited:\n{node.log_tail()}"
        r = httpx.get(f"http://127.0.0.1:{node.metrics_port}/health/live", timeout=HANG_S)
        assert r.status_code == 200, (node.role, r.text)


def assert_no_block_leaked(*nodes: Node, fake: FakePrefill | None = None) -> dict[str, dict]:
    """Once nothing is in flight: every block free or cached (evictable), none held. The
    `fake` prefill worker meanwhile answers what the decode node asked of it: an abandoned
    attempt's blocks are quarantined until their writer confirms (fencing)."""
    reports = {}
    for node in nodes:

        def idle(n: Node = node) -> bool:
            if fake is not None:
                fake.drain()
            kv = n.kv()
            return kv["requests"] == 0 and kv["in_use"] == 0 and kv["held"] == 0

        assert wait_until(idle), (node.role, node.kv())
        kv = reports[node.role] = node.kv()
        assert kv["free"] + kv["cached"] == kv["total"], (node.role, kv)
        assert not kv.get("jobs"), (node.role, kv)
    return reports


# -- HTTP -------------------------------------------------------------------------------


def answer(r: httpx.Response) -> str:
    """Check one HTTP answer: a success, or a 4xx in the API's error shape. Its outcome."""
    if r.status_code == 200:
        return "200"
    r.read()
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    error = r.json()["error"]
    assert error["code"] == r.status_code and error["type"] and error["message"], r.text
    return f"{r.status_code} {error['type']}"


def first_record(r: httpx.Response) -> None:
    """A /generate stream's first line is a record (it stays open after)."""
    line = next(r.iter_lines())
    record = json.loads(line)
    assert "token_ids" in record and "finish_reason" in record, record


def fuzz_http(sender: Sender, node: Node, port: str, prefills: list[str | None], tally: Tally,
              max_examples: int, url: str | None = None) -> None:  # fmt: skip
    """Any route, method, header and body at `node`'s HTTP port (or `url`, its metrics
    port; with `sender`'s token, and without it). A /generate stream that
    starts is read to its first record and left open for the next few messages (a replayed
    id meets a live one), then closed: the client going away aborts the request."""
    streams: deque[httpx.Response] = deque()

    def each(call: fz.HttpCall) -> None:
        r = sender.send(url or node.url, call)
        outcome = answer(r)
        tally.count(port, f"{call.method} {call.path.split('?')[0]} {outcome}")
        if outcome == "200" and call.path == "/generate":
            first_record(r)
            streams.append(r)
        else:
            r.close()
        while len(streams) > STREAMS_OPEN:
            streams.popleft().close()

    try:
        drive(fz.http_call(prefills), each, max_examples)
    finally:
        for r in streams:
            r.close()


# -- ZMQ --------------------------------------------------------------------------------


def local_kind(frames: list[bytes]) -> str:
    """What the prefill worker should make of a message: its type, or "undecodable"."""
    if len(frames) != 1:
        return "undecodable"
    try:
        return type(decode_to_prefill(frames[0])).__name__
    except msgspec.DecodeError:
        return "undecodable"


def fuzz_prefill_router(sender: Sender, prefill: Node, known: list[AgentInfo], tally: Tally,
                        max_examples: int) -> None:  # fmt: skip
    """Frames at the prefill worker's ROUTER from one peer: every undecodable message is
    counted, every aborted job is acknowledged, every request with a junk agent is refused."""
    port = "prefill zmq"
    dealer = sender.dealer(prefill.endpoint, fingerprint_of(prefill))
    before = refused(prefill, "undecodable")
    expected: Counter = Counter()
    aborted: set[AbortPrefill] = set()

    def each(frames: list[bytes]) -> None:
        kind = local_kind(frames)
        expected[kind] += 1
        if kind == "PrefillRequest" and decode_to_prefill(frames[0]).agent not in known:
            expected["junk agent"] += 1
        if kind == "AbortPrefill":  # a job's aborts are acknowledged once, when it ends
            aborted.add(decode_to_prefill(frames[0]))
        dealer.send_multipart(frames)
        tally.count(port, kind if len(frames) == 1 else f"{len(frames)} frames")

    try:
        drive(fz.to_prefill_frames(known), each, max_examples)
        replies: Counter = Counter()

        def answered() -> bool:
            while dealer.poll(10):
                replies[type(decode_from_prefill(dealer.recv())).__name__] += 1
            return (replies["AbortAck"] >= len(aborted)
                    and replies["PrefillFailed"] >= expected["junk agent"])  # fmt: skip

        assert wait_until(answered), (expected, replies)
        counted = lambda: refused(prefill, "undecodable") - before == expected["undecodable"]  # noqa: E731
        assert wait_until(counted), (expected, refused(prefill, "undecodable") - before)
        for kind, n in replies.items():
            tally.outcomes[port, f"answered {kind}"] += n
    finally:
        dealer.close(0)


def fuzz_pub(sender: Sender, node: Node, events_port: int, tally: Tally,
             max_examples: int) -> None:  # fmt: skip
    """Subscription frames (and junk) at a node's KV-event PUB socket from an XSUB."""
    port = f"{node.role} pub"
    xsub = sender.xsub(f"tcp://127.0.0.1:{events_port}")

    def each(frame: bytes) -> None:
        xsub.send(frame)
        tally.count(port, "sent")

    try:
        drive(fz.subscriptions(), each, max_examples)
    finally:
        xsub.close(0)


def fuzz_raw(sender: Sender, ports: dict[str, int], tally: Tally, max_examples: int) -> None:
    """Bytes below any protocol (no ZMTP greeting, no HTTP request line) at every port."""

    def each(example: tuple[str, bytes]) -> None:
        name, data = example
        sender.raw(ports[name], data)
        tally.count(f"{name} raw tcp", "sent")

    drive(st.tuples(st.sampled_from(sorted(ports)), st.binary(max_size=256)), each, max_examples)


# -- a fake prefill worker: the decode node's side of the ZMQ channel, and NIXL ----------


class FakePrefill:
    """A ROUTER the decode node sends prefill requests to. It answers each with fuzzed
    frames, and its NIXL agent sends the decode node fuzzed notifications; an abort it
    acknowledges properly, so the decode node's holds end."""

    def __init__(self, sender: Sender) -> None:
        self.sender = sender
        self.router = sender.socket(zmq.ROUTER, "tcp://127.0.0.1:*", bind=True)
        self.endpoint = self.router.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.agent = KVTransferAgent(new_agent_name("fuzz"), torch.zeros(4, 256, dtype=torch.uint8))
        self.decode_agents: list[AgentInfo] = []

    def serve(self, wait_s: float) -> tuple[bytes, PrefillRequest] | None:
        """Acknowledge aborts until a prefill request comes (or `wait_s` passes)."""
        deadline = time.monotonic() + wait_s
        while (left := deadline - time.monotonic()) > 0:
            self.agent.notifications()  # our agent makes progress only when polled
            if not self.router.poll(min(left, 0.05) * 1000):
                continue
            peer, data = self.router.recv_multipart()
            msg = decode_to_prefill(data)
            if isinstance(msg, Hello):
                self.router.send_multipart(
                    [peer, encode(self.sender.welcome(msg, self.agent.name))]
                )
                continue
            if isinstance(msg, AbortPrefill):
                self.router.send_multipart([peer, encode(AbortAck(msg.request_id, msg.attempt))])
                continue
            if msg.agent not in self.decode_agents:
                self.decode_agents.append(msg.agent)
                self.agent.connect(msg.agent)
            return peer, msg
        return None

    def drain(self) -> None:
        """Answer what waits: acknowledge aborts, refuse requests."""
        while (got := self.serve(wait_s=0.01)) is not None:
            self.refuse(*got)

    def refuse(self, peer: bytes, msg: PrefillRequest) -> None:
        self.router.send_multipart([peer, encode(PrefillFailed(msg.request_id, msg.attempt, "no"))])

    def close(self) -> None:
        self.router.close(0)


def remote_body(request_id: str, prefill: str) -> fz.HttpCall:
    body = {"request_id": request_id, "token_ids": list(range(1, 21)), "prefill": prefill,
            "sampling": {"max_tokens": 2, "temperature": 0.0}}  # fmt: skip
    return fz.HttpCall("POST", "/generate", {}, json.dumps(body).encode())


def fuzz_decode_replies(sender: Sender, decode: Node, fake: FakePrefill, tally: Tally,
                        max_examples: int) -> None:  # fmt: skip
    """For each example, a request names the fake prefill worker, which answers it with
    fuzzed frames and notifications about that attempt (or another); then the client goes
    away. The request fails over, completes, or is aborted; the node serves the next."""
    counter = iter(range(10**9))

    def each(data: st.DataObject) -> None:
        request_id = f"fz-{next(counter)}"
        r = sender.send(decode.url, remote_body(request_id, fake.endpoint))
        assert answer(r) == "200"
        got = fake.serve(wait_s=HANG_S)
        assert got is not None, "the decode node never sent its prefill request"
        peer, msg = got
        # frames and notifications about this attempt (or another), drawn now it is known
        replies = data.draw(st.lists(fz.from_prefill_frames(msg.request_id, msg.attempt),
                                     max_size=3))  # fmt: skip
        notifs = data.draw(st.lists(fz.notifications(msg.request_id, msg.attempt), max_size=2))
        for frames in replies:
            fake.router.send_multipart([peer, *frames])
        for note in notifs:
            fake.agent.notify(msg.agent.name, note)
        tally.count("decode zmq (replies)", "sent", len(replies))
        tally.count("decode nixl notifications", "sent", len(notifs))
        r.close()  # the client goes away: the decode node aborts what is left
        fake.serve(wait_s=0.05)

    drive(st.data(), each, max_examples)
