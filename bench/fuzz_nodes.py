"""Fuzzing a running prefill and decode pair at every port, at a larger count than the test
(`tests/disagg/test_fuzz_nodes.py`, same strategies and checks): prints messages sent per
port, what came back by outcome, whether both nodes are alive, and the KV blocks leaked.

    python -P bench/fuzz_nodes.py [--examples 300]

A failed check (a 500, a dropped connection, an uncounted refusal, a dead node, a leaked
block) stops the run with the example that broke it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for tests.disagg
sys.path.insert(0, str(Path(__file__).resolve().parent))  # for machine

import torch
from machine import describe_host

from tandem.engine.api.deployment_token import ENV as TOKEN_ENV
from tandem.engine.telemetry.metrics import REFUSAL_REASONS
from tandem.engine.tiny_model import make_model
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
    refused,
    remote_body,
)
from tests.disagg.nodes import Node, running
from tests.disagg.test_fuzz_nodes import DECODE_FLAGS, FLAGS, TOKEN, events_port


def fuzz(prefill: Node, decode: Node, examples: int) -> tuple[Tally, dict[str, dict]]:
    """What was sent and answered, and each node's block census once all is answered."""
    tally = Tally()
    sender = Sender(TOKEN)
    fake = FakePrefill(sender)
    try:
        r = sender.send(decode.url, remote_body("hello", fake.endpoint))
        fake.refuse(*fake.serve(wait_s=60))
        r.read()
        r.close()
        prefills = [None, prefill.endpoint, fake.endpoint]
        fuzz_http(sender, decode, "decode http", prefills, tally, examples)
        fuzz_http(sender, prefill, "prefill http", [None], tally, examples)
        for node in (prefill, decode):
            url = f"http://127.0.0.1:{node.metrics_port}"
            fuzz_http(sender, node, f"{node.role} metrics", [None], tally, examples // 2, url)
        fuzz_prefill_router(sender, prefill, fake.decode_agents, tally, examples)
        fuzz_decode_replies(sender, decode, fake, tally, examples // 2)
        fake.serve(wait_s=0.5)
        for node in (prefill, decode):
            fuzz_pub(sender, node, events_port(node), tally, examples)
        ports = {"prefill http": prefill.http_port, "prefill zmq": prefill.zmq_port,
                 "decode http": decode.http_port, "decode pub": events_port(decode),
                 "prefill pub": events_port(prefill), "prefill metrics": prefill.metrics_port,
                 "decode metrics": decode.metrics_port}  # fmt: skip
        fuzz_raw(sender, ports, tally, examples)
        assert_alive(prefill, decode)
        kv = assert_no_block_leaked(prefill, decode, fake=fake)
    finally:
        fake.close()
        sender.close()
    return tally, kv


def report(tally: Tally, kv: dict[str, dict], prefill: Node, decode: Node, seconds: float) -> None:
    print("\n| port | messages sent |\n|---|---:|")
    for port, n in sorted(tally.sent.items()):
        print(f"| {port} | {n} |")
    print(f"| all | {sum(tally.sent.values())} |")
    print("\n| port | outcome | count |\n|---|---|---:|")
    for (port, outcome), n in sorted(tally.outcomes.items()):
        print(f"| {port} | {outcome} | {n} |")
    for node in (prefill, decode):
        counts = {r: int(refused(node, r)) for r in REFUSAL_REASONS[node.role]}
        print(f"\n{node.role} tandem_refused_inputs_total: "
              + ", ".join(f"{r} {n}" for r, n in counts.items() if n))  # fmt: skip
    print("\nnodes alive: 2 of 2")
    for role, r in kv.items():
        print(f"{role}: blocks leaked 0 ({r['free']} free + {r['cached']} cached of {r['total']})")
    print(f"wall time: {seconds:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=300, help="examples per port")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"command: python {' '.join(sys.argv)}")
    print(f"machine: {describe_host()}, torch {torch.__version__}")
    root = Path(tempfile.mkdtemp())
    model = make_model(root / "llama", arch="llama")
    env = {TOKEN_ENV: TOKEN.value}
    nodes = {"prefill": Node("prefill", model, root, *FLAGS, env=env),
             "decode": Node("decode", model, root, *DECODE_FLAGS, env=env)}  # fmt: skip
    with running(nodes):
        start = time.monotonic()
        tally, kv = fuzz(nodes["prefill"], nodes["decode"], args.examples)
        report(tally, kv, nodes["prefill"], nodes["decode"], time.monotonic() - start)


if __name__ == "__main__":
    main()
