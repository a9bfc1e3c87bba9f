"""The chat chunk stream translated into Anthropic's events, on chunks written by hand:
block changes (thinking, text, two calls), the stop reasons, and an error mid-stream."""

from __future__ import annotations

import asyncio
import json

from tandem.router.messages_stream import message_events


def chunk(delta: dict | None = None, finish: str | None = None, stop=None) -> dict:
    choice = {"index": 0, "delta": delta or {}, "finish_reason": finish, "stop_reason": stop}
    return {"id": "chatcmpl-1", "choices": [choice], "usage": None}


USAGE = {"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 5}}


def events(chunks: list[dict]) -> list[tuple[str, dict]]:
    async def lines():
        for c in chunks:
            yield f"data: {json.dumps(c)}\n\n"
        yield "data: [DONE]\n\n"

    async def collect():
        return [e async for e in message_events(lines(), "msg_1", "m", [7])]

    out = []
    for text in asyncio.run(collect()):
        kind, data = text.strip().split("\n")
        body = json.loads(data.removeprefix("data: "))
        assert kind == f"event: {body['type']}"
        out.append((body["type"], body))
    return out


def test_blocks_open_and_close_as_the_reply_changes_kind():
    function = {"name": "f", "arguments": ""}
    call = {"index": 0, "id": "call_ab", "type": "function", "function": function}
    second = {**call, "index": 1, "id": "call_cd"}
    out = events([
        chunk({"role": "assistant", "content": ""}),
        chunk({"reasoning_content": "hm"}), chunk({"reasoning_content": "m"}),
        chunk({"content": "Sure."}),
        chunk({"tool_calls": [call]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a":'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}),
        chunk({"tool_calls": [second]}, finish="tool_calls"),
        USAGE,
    ])  # fmt: skip
    kinds = [k for k, _ in out]
    assert kinds == [
        "message_start",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_stop",
        "message_delta", "message_stop",
    ]  # fmt: skip
    starts = [b["content_block"] for k, b in out if k == "content_block_start"]
    assert [s["type"] for s in starts] == ["thinking", "text", "tool_use", "tool_use"]
    assert [s.get("id") for s in starts[2:]] == ["toolu_ab", "toolu_cd"]
    assert [b["index"] for k, b in out if k == "content_block_start"] == [0, 1, 2, 3]
    json_pieces = [b["delta"]["partial_json"] for k, b in out if k == "content_block_delta"
                   and b["delta"]["type"] == "input_json_delta"]  # fmt: skip
    assert "".join(json_pieces) == '{"a":1}'
    assert out[0][1]["message"]["usage"] == {"input_tokens": 7, "output_tokens": 0}
    assert out[-2][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert out[-2][1]["usage"] == {"input_tokens": 7, "output_tokens": 5}


def test_a_stop_string_is_the_stop_sequence_and_a_cut_is_max_tokens():
    stopped = events([chunk({"content": "ab"}, finish="stop", stop="##"), USAGE])
    assert stopped[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "##"}
    cut = events([chunk({"content": "ab"}, finish="length"), USAGE])
    assert cut[-2][1]["delta"]["stop_reason"] == "max_tokens"
    ended = events([chunk({"content": "ab"}, finish="stop", stop=2), USAGE])
    assert ended[-2][1]["delta"]["stop_reason"] == "end_turn"


def test_an_error_mid_stream_is_an_error_event_in_anthropics_shape():
    error = {"message": "decode worker failed", "type": "server_error", "param": None, "code": 502}
    out = events([chunk({"content": "ab"}), {"error": error}])
    assert [k for k, _ in out][-1] == "error"
    assert out[-1][1]["error"] == {"type": "api_error", "message": "decode worker failed"}


def test_a_fault_in_the_translation_still_ends_the_stream_with_an_error_event():
    out = events([chunk({"content": "ab"}), {"id": "chatcmpl-1", "no choices": []}, USAGE])
    assert [k for k, _ in out] == [
        "message_start", "content_block_start", "content_block_delta", "error",
    ]  # fmt: skip
    assert out[-1][1]["error"]["type"] == "api_error"
