"""The Responses API (`/v1/responses`) through a real `tandem serve` of a tiny random Qwen3
with Qwen3's chat template, driven by the openai SDK. A random model's words mean nothing,
so the protocol is what is checked: shapes, event order, calls that validate, usage that
adds up, and the prompt each request renders (its token count, against `/tokenize` of the
chat messages it means). `reasoning.effort` "none" turns thinking off, so replies are
answers (`qwen3_serve`'s parser starts every thinking reply inside its reasoning)."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from tests.bounds import HANG_S

MODEL = "qwen3"
NO_THINKING = {"effort": "none"}
PARAMETERS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOL = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
        "parameters": PARAMETERS, "strict": True}  # fmt: skip
CHAT_TOOL = {"type": "function", "function": {k: v for k, v in TOOL.items() if k != "type"}}


@pytest.fixture(scope="module")
def client(qwen3_serve):
    return openai.OpenAI(base_url=f"{qwen3_serve.url}/v1", api_key="unused", max_retries=0)


def num_tokens(serve, messages: list[dict], tools: list[dict] | None = None) -> int:
    """The token count of the chat messages as the router renders them, thinking off."""
    body = {"messages": messages, "chat_template_kwargs": {"enable_thinking": False}}
    if tools:
        body["tools"] = tools
    reply = httpx.post(f"{serve.url}/tokenize", json=body, timeout=HANG_S)
    assert reply.status_code == 200, reply.text
    return reply.json()["count"]


def check_usage(response, max_output: int) -> None:
    usage = response.usage
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert 0 < usage.output_tokens <= max_output
    assert usage.input_tokens_details.cached_tokens <= usage.input_tokens


def test_a_string_input_is_one_user_message(client, qwen3_serve):
    response = client.responses.create(
        model=MODEL, input="Hello there", max_output_tokens=8, reasoning=NO_THINKING
    )
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.model == MODEL and response.status in ("completed", "incomplete")
    (message,) = response.output
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_") and message.content[0].type == "output_text"
    assert response.output_text == message.content[0].text
    check_usage(response, 8)
    assert response.usage.output_tokens_details.reasoning_tokens == 0
    user = [{"role": "user", "content": "Hello there"}]
    assert response.usage.input_tokens == num_tokens(qwen3_serve, user)


def test_items_and_instructions_render_as_the_chat_messages_they_mean(client, qwen3_serve):
    items = [
        {"role": "developer", "content": "Answer in French."},
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "Hi"}, {"type": "input_text", "text": "!"}]},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Bonjour", "annotations": []}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},  # accepted, not rendered
        {"role": "user", "content": "And now?"},
    ]  # fmt: skip
    response = client.responses.create(
        model=MODEL, input=items, instructions="Be brief.", max_output_tokens=4,
        reasoning=NO_THINKING, metadata={"case": "items"},
    )  # fmt: skip
    assert response.instructions == "Be brief." and response.metadata == {"case": "items"}
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Answer in French."},  # developer: a system message
        {"role": "user", "content": "Hi\n!"},
        {"role": "assistant", "content": "Bonjour"},
        {"role": "user", "content": "And now?"},
    ]
    assert response.usage.input_tokens == num_tokens(qwen3_serve, messages)


def test_a_stream_is_the_typed_events_in_order_ending_in_the_stored_response(client):
    events = list(
        client.responses.create(
            model=MODEL, input="Stream it", max_output_tokens=6, reasoning=NO_THINKING,
            stream=True,
        )
    )  # fmt: skip
    assert [e.sequence_number for e in events] == list(range(len(events)))
    types = [e.type for e in events]
    deltas = types.count("response.output_text.delta")
    assert deltas >= 1
    assert types == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", *["response.output_text.delta"] * deltas,
        "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.incomplete",
    ]  # fmt: skip
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert final.status == "incomplete" and final.incomplete_details.reason == "max_output_tokens"
    assert events[-2].item.content[0].text == text == final.output_text
    assert events[2].item.id == final.output[0].id == events[-2].item.id
    assert final.usage.output_tokens == 6
    assert client.responses.retrieve(final.id).model_dump() == final.model_dump()


def test_the_sdk_stream_helper_assembles_the_final_response(client):
    """`responses.stream` (its final response needs `response.completed`: a forced call
    completes, where text from a random model runs to its budget)."""
    with client.responses.stream(
        model=MODEL,
        input="Again",
        tools=[TOOL],
        max_output_tokens=80,
        reasoning=NO_THINKING,
        tool_choice={"type": "function", "name": "get_weather"},
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[-1] == "response.completed" and final.status == "completed"
    (call,) = final.output
    assert client.responses.retrieve(final.id).output[0].arguments == call.arguments


def test_temperature_and_top_p_reach_the_engine(client):
    """Greedy (temperature 0), and sampling at temperature 1 with a `top_p` so small that
    only the likeliest token is left, both answer as the chat API answers greedily."""
    greedy = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Count"}], max_tokens=8,
        temperature=0, extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )  # fmt: skip
    expected = greedy.choices[0].message.content
    assert expected
    for sampling in ({"temperature": 0.0}, {"temperature": 1.0, "top_p": 1e-6}):
        response = client.responses.create(
            model=MODEL, input="Count", max_output_tokens=8, reasoning=NO_THINKING, **sampling
        )
        assert response.output_text == expected, sampling
        assert response.temperature == sampling["temperature"]
        assert response.top_p == sampling.get("top_p")


def test_thinking_on_makes_a_reasoning_item(client):
    """With no `reasoning` the template's default (thinking on): the reply starts inside
    its reasoning, which a random model never closes."""
    response = client.responses.create(model=MODEL, input="Think", max_output_tokens=6)
    (item,) = response.output
    assert item.type == "reasoning" and item.id.startswith("rs_") and item.summary == []
    assert item.content[0].type == "reasoning_text" and item.content[0].text
    assert response.status == "incomplete" and response.output_text == ""
    assert response.usage.output_tokens_details.reasoning_tokens == 6
    events = list(
        client.responses.create(model=MODEL, input="Think", max_output_tokens=6, stream=True)
    )
    reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    (done,) = [e for e in events if e.type == "response.reasoning_text.done"]
    assert reasoning == done.text == events[-1].response.output[0].content[0].text


def forced_call(client, **extra):
    return client.responses.create(
        model=MODEL, input="Weather in Paris?", tools=[TOOL], max_output_tokens=80,
        tool_choice={"type": "function", "name": "get_weather"}, reasoning=NO_THINKING,
        **extra,
    )  # fmt: skip


def test_a_forced_call_then_its_output_continues_the_stored_conversation(client, qwen3_serve):
    first = forced_call(client)
    assert first.status == "completed"
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    jsonschema.validate(json.loads(call.arguments), PARAMETERS)
    assert first.tools[0].name == "get_weather" and first.tool_choice.name == "get_weather"
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "22 C, sunny"}
    second = client.responses.create(
        model=MODEL, previous_response_id=first.id, input=[result], tools=[TOOL],
        max_output_tokens=4, reasoning=NO_THINKING,
    )  # fmt: skip
    assert second.previous_response_id == first.id
    conversation = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": call.call_id,
         "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "22 C, sunny"},
    ]  # fmt: skip
    assert second.usage.input_tokens == num_tokens(qwen3_serve, conversation, [CHAT_TOOL])


def test_a_streamed_call_sends_its_arguments_in_fragments(client):
    events = list(forced_call(client, stream=True))
    types = [e.type for e in events]
    assert types[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert types[-3:] == [
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed",
    ]  # fmt: skip
    fragments = "".join(
        e.delta for e in events if e.type == "response.function_call_arguments.delta"
    )
    (call,) = events[-1].response.output
    assert fragments == events[-3].arguments == call.arguments
    assert events[2].item.call_id == call.call_id and events[2].item.arguments == ""
    jsonschema.validate(json.loads(call.arguments), PARAMETERS)


def test_a_json_schema_format_yields_json_that_validates(client):
    # bounded, so that a random model's answer fits the budget (an unbounded integer may
    # run to any number of digits)
    number = {"type": "integer", "minimum": 0, "maximum": 999}
    schema = {"type": "object", "properties": {"n": number},
              "required": ["n"], "additionalProperties": False}  # fmt: skip
    fmt = {"type": "json_schema", "name": "number", "schema": schema, "strict": True}
    response = client.responses.create(
        model=MODEL, input="A number", text={"format": fmt}, max_output_tokens=60,
        reasoning=NO_THINKING,
    )  # fmt: skip
    assert response.status == "completed" and response.text.format.name == "number"
    jsonschema.validate(json.loads(response.output_text), schema)
    json_object = client.responses.create(
        model=MODEL, input="An object", text={"format": {"type": "json_object"}},
        max_output_tokens=200, reasoning=NO_THINKING,
    )  # fmt: skip
    if json_object.status == "completed":  # a random object may run past the budget
        assert isinstance(json.loads(json_object.output_text), dict)
    else:
        assert json_object.output_text.startswith("{")
