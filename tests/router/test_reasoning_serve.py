"""Reasoning through a real `tandem serve --reasoning-parser deepseek_r1`: the tiny model's
template opens no `<think>`, but with this parser its reply starts inside the reasoning, and
a random model never writes `</think>`: every reply is all reasoning, cut by `max_tokens`.
So the protocol is what is checked: where the text goes, streamed or not."""

from __future__ import annotations

import anthropic
import openai
import pytest

from tests.router.conftest import SERVE_FLAGS, serving

MODEL = "llama"
MESSAGES = [{"role": "user", "content": "Think it over."}]


@pytest.fixture(scope="module")
def serve(llama_dir, router_logs):
    flags = ("--prefill", "1", "--decode", "1", "--reasoning-parser", "deepseek_r1")
    with serving(llama_dir, router_logs, *flags, *SERVE_FLAGS) as proc:
        yield proc


@pytest.fixture(scope="module")
def client(serve):
    return openai.OpenAI(base_url=f"{serve.url}/v1", api_key="unused", max_retries=0)


def test_the_reply_is_reasoning_content_streamed_or_not(client):
    whole = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=12, temperature=0
    )
    message = whole.choices[0].message
    reasoning = message.model_extra["reasoning_content"]
    assert reasoning and message.content is None and whole.choices[0].finish_reason == "length"
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=12, temperature=0, stream=True
        )
    )
    deltas = [c.choices[0].delta for c in chunks]
    assert deltas[0].role == "assistant"
    streamed = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    assert streamed == reasoning
    assert "".join(d.content or "" for d in deltas) == ""
    assert chunks[-1].choices[0].finish_reason == "length"


def test_a_grammar_leaves_the_reasoning_free(client):
    """Grammars are enforced only after `</think>`: two that admit no common first
    character (a JSON object, the word "x") leave the same greedy reasoning, and neither
    shows in it. (Not the same as no grammar: the reasoning is still held to valid UTF-8,
    which a random byte-level model does not write.)"""
    replies = [
        client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=12, temperature=0,
            extra_body={"cache_salt": spec, **extra},
        ).choices[0].message.model_extra["reasoning_content"]
        for spec, extra in (
            ("json", {"response_format": {"type": "json_object"}}),
            ("choice", {"structured_outputs": {"choice": ["x"]}}),
        )
    ]  # fmt: skip
    assert replies[0] and replies[0] == replies[1] and replies[0][:1] not in ("{", "x")


def test_messages_carry_the_reasoning_as_thinking_blocks(serve):
    client = anthropic.Anthropic(base_url=serve.url, api_key="unused", max_retries=0)
    args = dict(model=MODEL, max_tokens=12, messages=MESSAGES, extra_body={"temperature": 0})
    whole = client.messages.create(**args)
    assert [b.type for b in whole.content] == ["thinking"] and whole.stop_reason == "max_tokens"
    events = list(client.messages.create(**args, stream=True))
    types = [e.type for e in events]
    assert types[:2] == ["message_start", "content_block_start"]
    assert types[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert events[1].content_block.type == "thinking"
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    assert {d.type for d in deltas} == {"thinking_delta"}
    assert "".join(d.thinking for d in deltas) == whole.content[0].thinking
