"""A Messages request as the chat request that serves it, and a chat answer as a message:
the translation on its own, without a server."""

from __future__ import annotations

import pytest

from tandem.router.anthropic_protocol import MessagesRequest
from tandem.router.errors import InvalidRequest
from tandem.router.messages import message_body, to_chat

TWO = {"type": "text", "text": "2"}
CALL = {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 1}}
RESULT = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [TWO]}
ADD = {"name": "add", "input_schema": {"type": "object"}}


def request(**fields) -> MessagesRequest:
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}]}
    return MessagesRequest.model_validate({**body, **fields})


def test_blocks_become_chat_messages_in_order():
    chat = to_chat(request(
        system=[{"type": "text", "text": "Be brief."}],
        messages=[
            {"role": "user", "content": "Add."},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hm", "signature": "s"},
                {"type": "text", "text": "Sure."}, CALL]},
            {"role": "user", "content": [RESULT, {"type": "text", "text": "Thanks."}]},
        ],
        tools=[ADD],
    ))  # fmt: skip
    roles = [(m.role, m.text()) for m in chat.messages]
    assert roles == [("system", "Be brief."), ("user", "Add."), ("assistant", "Sure."),
                     ("tool", "2"), ("user", "Thanks.")]  # fmt: skip
    (call,) = chat.messages[2].tool_calls
    assert (call.id, call.function.name, call.function.arguments) == ("toolu_1", "add", '{"a": 1}')
    assert chat.messages[3].tool_call_id == "toolu_1"
    assert chat.tools[0].function.parameters == {"type": "object"}
    assert chat.max_tokens == 5 and chat.add_generation_prompt


@pytest.mark.parametrize(
    ("choice", "expected", "parallel"),
    [
        ({"type": "auto"}, "auto", True),
        ({"type": "any", "disable_parallel_tool_use": True}, "required", False),
        ({"type": "none"}, "none", True),
    ],
)
def test_tool_choices_map_to_the_chat_ones(choice, expected, parallel):
    chat = to_chat(request(tools=[ADD], tool_choice=choice))
    assert chat.tool_choice == expected and chat.parallel_tool_calls is parallel


def test_a_named_tool_choice_and_the_sampling_fields():
    chat = to_chat(request(
        tools=[ADD], tool_choice={"type": "tool", "name": "add"}, stop_sequences=["##"],
        temperature=0.5, top_p=0.9, top_k=7, stream=True,
    ))  # fmt: skip
    assert chat.tool_choice.function.name == "add"
    assert (chat.stop, chat.temperature, chat.top_p, chat.top_k) == (["##"], 0.5, 0.9, 7)
    assert chat.stream and chat.include_usage  # the usage chunk gives message_delta its counts


def test_thinking_and_output_config_and_a_prefill():
    off = to_chat(request(thinking={"type": "disabled"}))
    assert off.chat_template_kwargs == {"enable_thinking": False}
    on = to_chat(request(thinking={"type": "adaptive"}))
    assert on.chat_template_kwargs == {"enable_thinking": True}
    deepseek = to_chat(request(thinking={"type": "disabled"}), "thinking")  # V3.1's switch
    assert deepseek.chat_template_kwargs == {"thinking": False}
    schema = {"type": "object"}
    shaped = to_chat(request(output_config={"format": {"type": "json_schema", "schema": schema}}))
    assert shaped.response_format.json_schema.json_schema == schema
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Well,"}]
    prefill = to_chat(request(messages=history))
    assert prefill.continue_final_message and not prefill.add_generation_prompt


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([{"role": "user", "content": [RESULT]}], "messages.0.content.0.tool_use_id"),
        ([{"role": "user", "content": [CALL]}], "messages.0.content.0"),
        ([{"role": "assistant", "content": [CALL]},
          {"role": "assistant", "content": [RESULT]}], "messages.1.content.0"),
    ],
)  # fmt: skip
def test_blocks_in_the_wrong_place_are_refused_naming_them(messages, param):
    with pytest.raises(InvalidRequest) as err:
        to_chat(request(messages=messages))
    assert err.value.param == param


def test_a_chat_answer_becomes_a_message():
    chat = {
        "model": "m",
        "choices": [{
            "index": 0, "finish_reason": "tool_calls", "stop_reason": None,
            "message": {"role": "assistant", "reasoning_content": "hm", "content": "Sure.",
                        "tool_calls": [{"id": "call_ab", "type": "function", "function": {
                            "name": "add", "arguments": '{"a": 1}'}},
                            {"id": "call_cd", "type": "function", "function": {
                            "name": "add", "arguments": "not json"}}]},
        }],
        "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13},
    }  # fmt: skip
    body = message_body(chat, "msg_1")
    assert [b["type"] for b in body["content"]] == ["thinking", "text", "tool_use", "tool_use"]
    assert body["content"][2] == {"type": "tool_use", "id": "toolu_ab", "name": "add",
                                  "input": {"a": 1}}  # fmt: skip
    assert body["content"][3]["input"] == {"arguments": "not json"}  # nothing lost
    assert body["stop_reason"] == "tool_use" and body["stop_sequence"] is None
    assert body["usage"] == {"input_tokens": 9, "output_tokens": 4}
