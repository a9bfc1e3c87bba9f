"""Prefill and decode nodes pair at first contact, on real processes: a decode node whose
fingerprint differs (here its revision) or that holds another deployment's token never
sends the prefill node its request (nor its agent metadata): the handshake fails, both
sides count the reason in `tandem_pairings_refused_total`, and the request is served by a
local prefill instead. Control routes answer only holders of the token; a connection that
never greeted gets no work done."""

from __future__ import annotations

import pytest
import torch
import zmq

from tandem.engine.api.deployment_token import ENV as TOKEN_ENV
from tandem.engine.core.sampling_params import SamplingParams
from tandem.engine.transfer.messages import (
    AgentInfo,
    KVLayout,
    PrefillFailed,
    PrefillRequest,
    decode_from_prefill,
    encode,
)
from tests.disagg.nodes import Node, generate, metric_value, running, wait_until

torch.set_num_threads(1)

OURS = {TOKEN_ENV: "our-deployment-token-0123456789"}
THEIRS = {TOKEN_ENV: "their-deployment-token-987654321"}
GREEDY = {"max_tokens": 3, "temperature": 0.0, "ignore_eos": True}
PROMPT = list(range(5, 25))  # over the remote-prefill threshold


@pytest.fixture(scope="module")
def nodes(llama_dir, node_logs):
    common = ("--max-model-len", "512", "--num-kv-blocks", "64", "--revision", "r1")
    other_revision = ("--max-model-len", "512", "--num-kv-blocks", "64", "--revision", "r2")
    spec = {
        "prefill": Node("prefill", llama_dir, node_logs, *common, env=OURS),
        "decode": Node("decode", llama_dir, node_logs, *common, env=OURS),
        "newer": Node("decode", llama_dir, node_logs, *other_revision, env=OURS),
        "stranger": Node("decode", llama_dir, node_logs, *common, env=THEIRS),
    }
    with running(spec):
        yield spec


def refusals(node: Node, reason: str) -> float:
    return metric_value(node.metrics(), "tandem_pairings_refused_total", reason=reason)


def refused(node: Node, reason: str) -> float:
    return metric_value(node.metrics(), "tandem_refused_inputs_total", reason=reason)


def fallbacks(node: Node) -> float:
    return metric_value(node.metrics(), "tandem_prefill_fallbacks_total")


def test_nodes_of_one_deployment_pair_and_prefill_remotely(nodes):
    decode, prefill = nodes["decode"], nodes["prefill"]
    before = metric_value(prefill.metrics(), "tandem_prompt_tokens_total")
    tokens, _, last = generate(decode, "ours", PROMPT, GREEDY, prefill, headers=decode.headers)
    assert len(tokens) == 3 and last["finish_reason"] == "length"
    assert fallbacks(decode) == 0
    assert metric_value(prefill.metrics(), "tandem_prompt_tokens_total") > before


@pytest.mark.parametrize("name, reason", [("newer", "revision"), ("stranger", "token")])
def test_a_node_that_does_not_match_never_pairs_and_serves_locally(nodes, name, reason):
    decode, prefill = nodes[name], nodes["prefill"]
    before = metric_value(prefill.metrics(), "tandem_prompt_tokens_total")
    tokens, _, last = generate(decode, name, PROMPT, GREEDY, prefill, headers=decode.headers)
    assert len(tokens) == 3 and last["finish_reason"] == "length"  # prefilled locally
    assert fallbacks(decode) == 1
    assert refusals(prefill, reason) == 1 and refusals(decode, reason) == 1
    assert metric_value(prefill.metrics(), "tandem_prompt_tokens_total") == before


def test_a_request_without_the_token_is_refused_and_counted(nodes):
    decode = nodes["decode"]
    _, _, last = generate(decode, "anon", PROMPT, GREEDY)
    assert last["status"] == 401 and last["error"]["type"] == "authentication_error"
    counted = metric_value(
        decode.metrics(), "tandem_refused_inputs_total", reason="unauthenticated"
    )
    assert counted >= 1


def test_a_connection_that_never_greeted_gets_no_work_done(nodes):
    prefill = nodes["prefill"]
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    try:
        dealer.connect(prefill.endpoint)
        layout = KVLayout(0, 64, 8, 0, "DRAM")
        msg = PrefillRequest(
            "sneaky", 1, PROMPT, SamplingParams(), 0, [0, 1], AgentInfo("x", b"", layout),
            60.0, 0.0,
        )  # fmt: skip
        dealer.send(encode(msg))
        assert wait_until(lambda: dealer.poll(0))
        assert decode_from_prefill(dealer.recv()) == PrefillFailed("sneaky", 1, "unpaired")
        assert (
            metric_value(prefill.metrics(), "tandem_refused_inputs_total", reason="unpaired") == 1
        )
    finally:
        dealer.close(0)
        context.term()
