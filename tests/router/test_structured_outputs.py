"""Structured outputs and tool calling through a real `tandem serve` (router, prefill and
decode processes: the grammar spec travels router -> decode -> prefill, the prefill node
samples the first token under it and the decode node's matcher goes on from there), with
the official openai client. The tiny model is random: whatever valid output comes back is
the grammar's doing."""

from __future__ import annotations

import json
import uuid
from typing import Literal

import hypothesis.strategies as st
import jsonschema
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from pydantic import BaseModel, Field

from tandem.engine.tokenizer import encode_chat
from tests.disagg.nodes import metric_value
from tests.router.conftest import LONG_PROMPT_FLAGS, serving

MODEL = "llama"
MESSAGES = [{"role": "user", "content": "Fill in the form."}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 8},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}},
            "required": ["a"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def serve(llama_dir, router_logs):
    """A `tandem serve` of this module's own, for prompts with tool signatures."""
    roles = ("--prefill", "1", "--decode", "1")
    with serving(llama_dir, router_logs, *roles, *LONG_PROMPT_FLAGS) as proc:
        yield proc


@pytest.fixture(scope="module")
def client(serve):
    return openai.OpenAI(base_url=f"{serve.url}/v1", api_key="unused", max_retries=0)


def salt() -> dict:
    """A cache salt of its own: the request computes its prompt afresh, exactly as the one it
    is compared with (a prefix hit would sum in another order)."""
    return {"cache_salt": uuid.uuid4().hex}


# -- JSON schemas drawn at random ------------------------------------------------------

_KEYS = st.text("abcdefgh", min_size=1, max_size=4)
# Leaves whose every instance is short, so max_tokens is never what ends an output.
_LEAVES = st.one_of(
    st.integers(0, 6).map(lambda n: {"type": "string", "maxLength": n}),
    st.tuples(st.integers(-50, 50), st.integers(0, 100)).map(
        lambda r: {"type": "integer", "minimum": r[0], "maximum": r[0] + r[1]}
    ),
    st.integers(-5, 5).map(lambda lo: {"type": "number", "minimum": lo, "maximum": lo + 10}),
    st.sampled_from(
        [
            {"type": "boolean"},
            {"type": "null"},
            {"type": "string", "pattern": "^[a-z]{1,3}-[0-9]{2}$"},
            {"type": "string", "format": "date"},
            {"anyOf": [{"type": "boolean"}, {"type": "integer", "minimum": 0, "maximum": 9}]},
        ]
    ),
    st.lists(
        st.one_of(st.text("xyz", max_size=3), st.integers(-9, 9)),
        min_size=1,
        max_size=4,
        unique=True,
    ).map(lambda values: {"enum": values}),
)


def _object(properties: dict, data: list[bool]) -> dict:
    required = [k for k, keep in zip(properties, data) if keep]
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def _compound(children):
    objects = st.dictionaries(_KEYS, children, min_size=1, max_size=3).flatmap(
        lambda props: st.lists(st.booleans(), min_size=len(props), max_size=len(props)).map(
            lambda keep: _object(props, keep)
        )
    )
    arrays = st.tuples(children, st.integers(0, 1), st.integers(1, 3)).map(
        lambda a: {"type": "array", "items": a[0], "minItems": a[1], "maxItems": a[2]}
    )
    return st.one_of(objects, arrays)


SCHEMAS = st.recursive(_LEAVES, _compound, max_leaves=6).map(
    lambda s: s if s.get("type") == "object" else _object({"value": s}, [True])
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(schema=SCHEMAS, seed=st.integers(0, 2**31))
def test_json_schema_output_always_validates_streamed_or_not(client, schema, seed):
    args = dict(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=450,
        seed=seed,
        response_format={"type": "json_schema", "json_schema": {"name": "form", "schema": schema}},
    )
    whole = client.chat.completions.create(**args, extra_body=salt()).choices[0]
    assert whole.finish_reason == "stop", (schema, whole.message.content)
    jsonschema.validate(json.loads(whole.message.content), schema)
    chunks = list(client.chat.completions.create(**args, stream=True, extra_body=salt()))
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert text == whole.message.content  # the same seed, the same computation


class Reading(BaseModel):
    unit: Literal["celsius", "fahrenheit"]
    value: int = Field(ge=-50, le=50)
    valid: bool
    station: str = Field(max_length=5)


def test_parse_returns_the_pydantic_object(client):
    r = client.chat.completions.parse(
        model=MODEL, messages=MESSAGES, response_format=Reading, max_tokens=200, seed=7
    )
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Reading)
    assert parsed == Reading.model_validate_json(r.choices[0].message.content)


def test_json_object_and_structured_outputs_on_both_endpoints(client):
    r = client.completions.create(
        model=MODEL,
        prompt="Pick:",
        max_tokens=10,
        extra_body={"structured_outputs": {"choice": ["alpha", "beta"]}},
    )
    assert r.choices[0].text in ("alpha", "beta") and r.choices[0].finish_reason == "stop"
    r = client.completions.create(
        model=MODEL,
        prompt="Code:",
        max_tokens=20,
        extra_body={"structured_outputs": {"regex": "[A-Z]{3}-[0-9]{4}"}},
    )
    assert len(r.choices[0].text) == 8 and r.choices[0].text[3] == "-"
    r = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=300,
        seed=1,
        response_format={"type": "json_object"},
    )
    assert r.choices[0].message.content.startswith("{")


# -- tools ------------------------------------------------------------------------------


def reassembled(chunks) -> tuple[str, list[tuple[str, str, str]], str]:
    """(content, [(id, name, arguments)], finish_reason) from a stream's deltas."""
    content, calls, finish = "", {}, None
    for chunk in chunks:
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for call in choice.delta.tool_calls or []:
            entry = calls.setdefault(call.index, ["", "", ""])
            if call.id:
                assert call.type == "function" and call.function.name and not entry[0]
                entry[0], entry[1] = call.id, call.function.name
            entry[2] += call.function.arguments or ""
        finish = choice.finish_reason or finish
    return content, [tuple(calls[i]) for i in sorted(calls)], finish


def assert_valid_calls(calls, tools) -> None:
    parameters = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    assert calls
    for name, arguments in calls:
        jsonschema.validate(json.loads(arguments), parameters[name])


@pytest.mark.parametrize("parallel", [False, True])
def test_required_tool_choice_returns_valid_calls_streamed_alike(client, parallel):
    tools = [WEATHER, ADD]
    args = dict(
        model=MODEL,
        messages=MESSAGES,
        tools=tools,
        tool_choice="required",
        parallel_tool_calls=parallel,
        max_tokens=300,
        seed=3,
    )
    whole = client.chat.completions.create(**args, extra_body=salt()).choices[0]
    calls = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    assert whole.finish_reason == "tool_calls" and whole.message.content is None
    assert len({c.id for c in whole.message.tool_calls}) == len(calls)
    assert_valid_calls(calls, tools)
    if not parallel:
        assert len(calls) == 1
    content, streamed, finish = reassembled(
        client.chat.completions.create(**args, stream=True, extra_body=salt())
    )
    assert (content, finish) == ("", "tool_calls")
    assert [(name, arguments) for _, name, arguments in streamed] == calls


def test_a_named_function_is_the_one_called(client):
    choice = {"type": "function", "function": {"name": "add"}}
    for seed in range(3):
        r = client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            tools=[WEATHER, ADD],
            tool_choice=choice,
            max_tokens=100,
            seed=seed,
        )
        calls = r.choices[0].message.tool_calls
        assert [c.function.name for c in calls] == ["add"]
        assert_valid_calls([(c.function.name, c.function.arguments) for c in calls], [ADD])


def test_tool_choice_none_leaves_the_reply_as_content(client):
    r = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=[WEATHER], tool_choice="none", max_tokens=12
    )
    message = r.choices[0].message
    assert message.tool_calls is None and isinstance(message.content, str)


def test_a_conversation_with_tool_results_round_trips_the_chat_template(client, tokenizer):
    call_id = "call_abc123"
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": "22 C, sunny"},
    ]
    r = client.chat.completions.create(
        model=MODEL, messages=history, tools=[WEATHER], max_tokens=8, seed=1
    )
    rendered = [
        history[0],
        {**history[1], "content": "", "tool_calls": [{
            "id": call_id, "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
        }]},
        history[2],
    ]  # fmt: skip
    expected = encode_chat(tokenizer, rendered, tools=[WEATHER])
    assert r.usage.prompt_tokens == len(expected)
    text = tokenizer.decode(expected)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in text
    assert "<tool_response>\n22 C, sunny\n</tool_response>" in text
    assert '"name": "get_weather", "description": "The weather in a city."' in text


# -- bad input ---------------------------------------------------------------------------

BAD = [
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "strng"}}}), "response_format"),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "array", "uniqueItems": True}}}), "response_format"),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "string", "pattern": "a(b"}}}), "response_format"),
    (dict(response_format={"type": "json_schema"}), "response_format"),
    (dict(response_format={"type": "yaml"}), "response_format.type"),
    (dict(extra_body={"structured_outputs": {"regex": "a(b"}}), "structured_outputs"),
    (dict(extra_body={"structured_outputs": {"regex": "a", "choice": ["a"]}}),
     "structured_outputs"),
    (dict(extra_body={"structured_outputs": {"grammar": "start: nothing"}}),
     "structured_outputs"),
    (dict(response_format={"type": "json_object"},
          extra_body={"structured_outputs": {"choice": ["a"]}}), "structured_outputs"),
    (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}),
     "tool_choice"),
    (dict(tool_choice="required"), "tool_choice"),
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "not": {}}}}], tool_choice="required"), "tools"),
    (dict(messages=[{"role": "tool", "content": "x"}]), "messages.0.tool_call_id"),
]  # fmt: skip


@pytest.mark.parametrize(("kwargs", "param"), BAD)
def test_bad_input_is_a_400_naming_the_field_before_anything_is_scheduled(
    client, serve, kwargs, param
):
    before = metric_value(serve.metrics(), "tandem_router_worker_selections_total")
    args = {"model": MODEL, "messages": MESSAGES, "max_tokens": 8, **kwargs}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(**args)
    error = info.value.body
    assert info.value.status_code == 400 and error["param"] == param, error
    assert error["type"] == "invalid_request_error"
    assert metric_value(serve.metrics(), "tandem_router_worker_selections_total") == before


def test_structured_outputs_a_model_cannot_have_are_a_400_and_plain_requests_pass(tokenizer):
    """A tokenizer llguidance refuses does not stop the router: a request asking for a
    grammar gets a 400 saying why; one asking for none is untouched."""
    from tandem.engine.structured.grammar import GrammarCompiler
    from tandem.router.errors import InvalidRequest
    from tandem.router.protocol import ChatCompletionRequest
    from tandem.router.structured import StructuredOutputs

    class RefusedTokenizer:  # not a fast tokenizer: llguidance cannot take it
        def __len__(self) -> int:
            return 10

    structured = StructuredOutputs(tokenizer, len(tokenizer), [2])
    structured.grammars = GrammarCompiler(RefusedTokenizer(), 10, [2])
    structured.grammars.prepare()
    messages = [{"role": "user", "content": "hi"}]
    assert structured.spec(ChatCompletionRequest(messages=messages)) is None
    asking = ChatCompletionRequest(messages=messages, response_format={"type": "json_object"})
    with pytest.raises(InvalidRequest, match="not available for this model") as caught:
        structured.spec(asking)
    body = json.loads(caught.value.response().body)
    assert caught.value.status == 400 and body["error"]["param"] == "response_format"
