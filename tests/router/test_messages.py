"""The Anthropic Messages API through a real `tandem serve` (router, prefill and decode
processes), with the official `anthropic` client. The tiny model is random: what is
checked is the protocol (event order, blocks, stop reasons, usage), and what a grammar
makes of its output (a forced tool call that validates)."""

from __future__ import annotations

import json
import re

import anthropic
import httpx
import jsonschema
import pytest

from tests.bounds import HANG_S
from tests.disagg.nodes import wait_until
from tests.router.conftest import LONG_PROMPT_FLAGS, RouterProc, serving

MODEL = "llama"
USER = [{"role": "user", "content": "Tell me about the weather."}]
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 8},
            "unit": {"enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}
FORCED = {"type": "tool", "name": "get_weather"}
# Greedy. (This SDK has no `temperature` argument any more; the router still takes it.)
GREEDY = {"extra_body": {"temperature": 0}}


@pytest.fixture(scope="module")
def serve(llama_dir, router_logs):
    """A `tandem serve` of this module's own, for prompts with tool signatures."""
    roles = ("--prefill", "1", "--decode", "1")
    with serving(llama_dir, router_logs, *roles, *LONG_PROMPT_FLAGS) as proc:
        yield proc


@pytest.fixture(scope="module")
def client(serve):
    return anthropic.Anthropic(base_url=serve.url, api_key="unused", max_retries=0)


def tokenize(serve, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    """The prompt of these OpenAI-shaped messages, as the router renders it."""
    body = {"messages": messages, "tools": tools}
    r = httpx.post(f"{serve.url}/tokenize", json=body, timeout=HANG_S)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def as_function(tool: dict) -> dict:
    function = {"name": tool["name"], "description": tool["description"]}
    return {"type": "function", "function": {**function, "parameters": tool["input_schema"]}}


def test_a_plain_message_has_text_a_stop_reason_and_usage_that_adds_up(client, serve):
    r = client.messages.create(model=MODEL, max_tokens=8, messages=USER, **GREEDY)
    assert r.type == "message" and r.role == "assistant" and r.model == MODEL
    assert r.id.startswith("msg_") and [b.type for b in r.content] in ([], ["text"])
    assert r.stop_reason in ("end_turn", "max_tokens") and r.stop_sequence is None
    assert r.usage.input_tokens == len(tokenize(serve, USER))
    counted = client.messages.count_tokens(model=MODEL, messages=USER)
    assert counted.input_tokens == r.usage.input_tokens
    if r.stop_reason == "max_tokens":
        assert r.usage.output_tokens == 8
    assert 1 <= r.usage.output_tokens <= 8


def test_a_system_prompt_in_blocks_reaches_the_template(client, serve):
    system = [{"type": "text", "text": "You are terse."}, {"type": "text", "text": "Be kind."}]
    r = client.messages.create(model=MODEL, max_tokens=2, messages=USER, system=system)
    expected = [{"role": "system", "content": "You are terse.\nBe kind."}, *USER]
    assert r.usage.input_tokens == len(tokenize(serve, expected))


def test_a_last_assistant_message_is_a_prefill_the_reply_goes_on_with(client, serve):
    history = [*USER, {"role": "assistant", "content": "The answer is"}]
    r = client.messages.create(model=MODEL, max_tokens=4, messages=history)
    body = {"messages": history, "add_generation_prompt": False, "continue_final_message": True}
    prompt = httpx.post(f"{serve.url}/tokenize", json=body, timeout=HANG_S).json()["tokens"]
    assert r.usage.input_tokens == len(prompt)
    rendered = httpx.post(f"{serve.url}/detokenize", json={"tokens": prompt}, timeout=HANG_S)
    assert rendered.json()["prompt"].endswith("<|im_start|>assistant\nThe answer is")


# message_start, blocks (start, deltas, stop), message_delta, message_stop
EVENT_ORDER = re.compile(
    r"message_start( content_block_start( content_block_delta)* content_block_stop)*"
    r" message_delta message_stop"
)


def event_types(events) -> str:
    return " ".join(e.type for e in events)


def test_a_stream_has_anthropics_event_order_and_its_deltas_make_the_message(client, serve):
    events = list(client.messages.create(
        model=MODEL, max_tokens=12, messages=USER, **GREEDY, stream=True
    ))  # fmt: skip
    assert EVENT_ORDER.fullmatch(event_types(events)), event_types(events)
    start, delta = events[0], events[-2]
    assert start.message.usage.input_tokens == len(tokenize(serve, USER))
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    with client.messages.stream(model=MODEL, max_tokens=12, messages=USER, **GREEDY) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == "".join(b.text for b in final.content if b.type == "text")
    assert delta.delta.stop_reason == final.stop_reason
    assert delta.usage.output_tokens == final.usage.output_tokens
    assert text and final.usage.input_tokens == start.message.usage.input_tokens


def test_a_forced_tool_call_round_trips(client, serve):
    r = client.messages.create(
        model=MODEL, max_tokens=200, messages=USER, tools=[WEATHER], tool_choice=FORCED
    )
    assert r.stop_reason == "tool_use"
    (call,) = [b for b in r.content if b.type == "tool_use"]
    assert call.name == "get_weather" and call.id.startswith("toolu_")
    jsonschema.validate(call.input, WEATHER["input_schema"])
    result = {"type": "tool_result", "tool_use_id": call.id, "content": "22 C, sunny"}
    history = [*USER, {"role": "assistant", "content": r.content},
               {"role": "user", "content": [result]}]  # fmt: skip
    answer = client.messages.create(model=MODEL, max_tokens=4, messages=history, tools=[WEATHER])
    assert answer.type == "message"
    arguments = json.dumps(call.input)  # any spelling: the template gets the object
    openai_history = [*USER, {
        "role": "assistant", "content": None, "tool_calls": [{"id": call.id, "type": "function",
        "function": {"name": "get_weather", "arguments": arguments}}],
    }, {"role": "tool", "tool_call_id": call.id, "content": "22 C, sunny"}]  # fmt: skip
    prompt = tokenize(serve, openai_history, [as_function(WEATHER)])
    assert answer.usage.input_tokens == len(prompt)
    counted = client.messages.count_tokens(model=MODEL, messages=history, tools=[WEATHER])
    assert counted.input_tokens == len(prompt)
    rendered = httpx.post(f"{serve.url}/detokenize", json={"tokens": prompt}, timeout=HANG_S)
    assert "<tool_response>\n22 C, sunny\n</tool_response>" in rendered.json()["prompt"]


def test_a_streamed_tool_call_comes_as_input_json_deltas(client):
    tool_choice = {"type": "any", "disable_parallel_tool_use": True}
    events = list(client.messages.create(
        model=MODEL, max_tokens=200, messages=USER, tools=[WEATHER], tool_choice=tool_choice,
        stream=True,
    ))  # fmt: skip
    assert EVENT_ORDER.fullmatch(event_types(events)), event_types(events)
    starts = [e.content_block for e in events if e.type == "content_block_start"]
    assert [b.type for b in starts] == ["tool_use"] and starts[0].name == "get_weather"
    fragments = [e.delta.partial_json for e in events if e.type == "content_block_delta"]
    jsonschema.validate(json.loads("".join(fragments)), WEATHER["input_schema"])
    assert events[-2].delta.stop_reason == "tool_use"


def test_output_config_format_makes_the_reply_json_under_its_schema(client):
    schema = WEATHER["input_schema"]
    output_config = {"format": {"type": "json_schema", "schema": schema}}
    r = client.messages.create(
        model=MODEL, max_tokens=200, messages=USER, extra_body={"output_config": output_config}
    )
    assert r.stop_reason == "end_turn"  # the grammar completed
    jsonschema.validate(json.loads(r.content[0].text), schema)


def test_a_stop_sequence_ends_the_text_before_it(client):
    args = dict(model=MODEL, max_tokens=40, messages=USER, **GREEDY)
    full = client.messages.create(**args)
    text = full.content[0].text
    assert len(text) >= 10, text  # long enough to cut (greedy: the same each run)
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    cut = client.messages.create(**args, stop_sequences=[stop, "\x00never"])
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].text == text[: text.index(stop)]
    with client.messages.stream(**args, stop_sequences=[stop]) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == stop


BAD = {
    "max_tokens is a string": ({"max_tokens": "many"}, 400, "invalid_request_error"),
    "no max_tokens": ({"max_tokens": None}, 400, "invalid_request_error"),
    "messages is a string": ({"messages": "hi"}, 400, "invalid_request_error"),
    "an image block": (
        {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
        400, "invalid_request_error",
    ),
    "an unknown model": ({"model": "claude-opus-9"}, 404, "not_found_error"),
    "an unknown tool_use id": (
        {"messages": [*USER, {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_nope", "content": "x"}]}]},
        400, "invalid_request_error",
    ),
    "a tool_choice naming no tool": (
        {"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "other"}},
        400, "invalid_request_error",
    ),
    "max_tokens past the context": ({"max_tokens": 10**6}, 400, "invalid_request_error"),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_an_error_in_anthropics_shape_and_the_server_stays_up(client, serve, case):
    change, status, kind = BAD[case]
    body = {"model": MODEL, "max_tokens": 4, "messages": USER, **change}
    body = {k: v for k, v in body.items() if v is not None}
    r = httpx.post(f"{serve.url}/v1/messages", json=body, timeout=HANG_S)
    assert r.status_code == status, r.text
    error = r.json()
    assert error["type"] == "error" and error["error"]["type"] == kind
    assert error["error"]["message"]
    assert client.messages.create(model=MODEL, max_tokens=2, messages=USER).type == "message"


def test_malformed_json_and_wrong_methods_answer_in_anthropics_shape(serve):
    r = httpx.post(
        f"{serve.url}/v1/messages",
        content=b"{",
        headers={"content-type": "application/json"},
        timeout=HANG_S,
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    wrong = httpx.get(f"{serve.url}/v1/messages", timeout=HANG_S)
    assert wrong.status_code == 405 and "POST" in wrong.headers["allow"]
    assert wrong.json()["type"] == "error"


@pytest.fixture(scope="module")
def keyed_router(serve, llama_dir, router_logs):
    """A router with an API key over the same workers."""
    prefill = [w["url"] for w in serve.workers("prefill")]
    decode = [w["url"] for w in serve.workers("decode")]
    flags = ("--max-model-len", "2048", "--api-key", "secret")
    proc = RouterProc(llama_dir, router_logs, prefill, decode, *flags)
    try:
        proc.start().wait_ready()
        health = f"{proc.url}/health"
        assert wait_until(lambda: httpx.get(health, timeout=HANG_S).status_code == 200)
        yield proc
    finally:
        proc.stop()


def test_an_api_key_is_taken_as_x_api_key_or_bearer(keyed_router):
    url = f"{keyed_router.url}/v1/messages"
    body = {"model": MODEL, "max_tokens": 2, "messages": USER}
    missing = httpx.post(url, json=body, timeout=HANG_S)
    assert missing.status_code == 401
    assert missing.json()["error"]["type"] == "authentication_error"
    wrong = anthropic.Anthropic(base_url=keyed_router.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        wrong.messages.create(**body)
    keyed = anthropic.Anthropic(base_url=keyed_router.url, api_key="secret", max_retries=0)
    assert keyed.messages.create(**body).type == "message"  # the SDK sends x-api-key
    bearer = {"Authorization": "Bearer secret"}
    assert httpx.post(url, json=body, headers=bearer, timeout=HANG_S).status_code == 200
