"""A chat completion's chunk stream as the Messages API's event stream.

`message_start`, then per content block (`thinking`, `text`, `tool_use`, in the order the
reply writes them) `content_block_start`, its deltas (`thinking_delta`, `text_delta`,
`input_json_delta`) and `content_block_stop`, then `message_delta` (`stop_reason`, usage)
and `message_stop`. The chat stream's usage chunk (the translation asks for one) gives the
counts; an error event in it becomes an `error` event, and the stream ends there.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from tandem.router.errors import anthropic_error_type

logger = logging.getLogger(__name__)


@dataclass
class _Blocks:
    """What was sent: whether the message started, the open block's type, how many blocks
    were opened; and how the reply finished. `events` are the ones not yet yielded."""

    started: bool = False
    open_type: str | None = None
    num_opened: int = 0
    finish_reason: str | None = None
    stop: str | int | None = None
    events: list[str] = field(default_factory=list)
    failed: bool = False  # an error event was sent: the stream ends there

    def emit(self, kind: str, **body: Any) -> None:
        self.events.append(event(kind, {"type": kind, **body}))
        self.failed = self.failed or kind == "error"

    def delta(
        self, block_type: str, delta: dict[str, Any], start: dict[str, Any] | None = None
    ) -> None:
        """`delta` to the open block. `start`: the block this piece may open (a text or
        thinking piece continues an open block of its type; every call is a block)."""
        if start is not None and (self.open_type != block_type or block_type == "tool_use"):
            self.close()
            self.emit("content_block_start", index=self.num_opened, content_block=start)
            self.open_type = block_type
            self.num_opened += 1
        if delta:
            self.emit("content_block_delta", index=self.num_opened - 1, delta=delta)

    def close(self) -> None:
        if self.open_type is not None:
            self.emit("content_block_stop", index=self.num_opened - 1)
            self.open_type = None


async def message_events(
    chunks: AsyncIterator[str], message_id: str, model: str, num_prompt_tokens: list[int]
) -> AsyncIterator[str]:
    """The events for a chat stream's `data:` lines. `num_prompt_tokens` holds the prompt's
    token count by the time the first line comes (the generation was built before)."""
    blocks = _Blocks()
    async for line in chunks:
        payload = line.removeprefix("data: ").strip()
        if payload == "[DONE]":
            break
        try:
            chunk = json.loads(payload)
            if not blocks.started and "error" not in chunk:
                blocks.started = True
                blocks.emit("message_start", message=_start(message_id, model, num_prompt_tokens))
            _translate(blocks, chunk)
        except Exception:  # a fault of ours: the client still gets an end, as on the chat path
            logger.exception("message %s: translating the stream failed", message_id)
            fault = {"type": "api_error", "message": "the router failed while streaming"}
            blocks.emit("error", error=fault)
        for item in blocks.events:
            yield item
        if blocks.failed:
            break
        blocks.events.clear()


def _translate(blocks: _Blocks, chunk: dict[str, Any]) -> None:
    if "error" in chunk:
        error = chunk["error"]
        kind = anthropic_error_type(error["code"] or 500)
        blocks.emit("error", error={"type": kind, "message": error["message"]})
        return
    for choice in chunk["choices"]:
        _delta(blocks, choice["delta"])
        if choice["finish_reason"] is not None:
            blocks.finish_reason, blocks.stop = choice["finish_reason"], choice["stop_reason"]
    if chunk.get("usage"):
        _finish(blocks, chunk["usage"])


def _delta(blocks: _Blocks, delta: dict[str, Any]) -> None:
    if delta.get("reasoning_content"):
        piece = {"type": "thinking_delta", "thinking": delta["reasoning_content"]}
        blocks.delta("thinking", piece, {"type": "thinking", "thinking": "", "signature": ""})
    if delta.get("content"):
        piece = {"type": "text_delta", "text": delta["content"]}
        blocks.delta("text", piece, {"type": "text", "text": ""})
    for entry in delta.get("tool_calls") or []:
        function = entry.get("function", {})
        start = tool_use_block(entry["id"], function["name"]) if "id" in entry else None
        fragment = function.get("arguments")
        piece = {"type": "input_json_delta", "partial_json": fragment} if fragment else {}
        blocks.delta("tool_use", piece, start)


def _finish(blocks: _Blocks, usage: dict[str, Any]) -> None:
    blocks.close()
    stop_reason, stop_sequence = stop_reason_of(blocks.finish_reason, blocks.stop)
    blocks.emit(
        "message_delta",
        delta={"stop_reason": stop_reason, "stop_sequence": stop_sequence},
        usage={"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"]},
    )
    blocks.emit("message_stop")


def tool_use_block(call_id: str, name: str) -> dict[str, Any]:
    """A `tool_use` block with no input yet; ids `toolu_` + the call id's digits."""
    if call_id.startswith("call_"):
        call_id = "toolu_" + call_id[len("call_") :]
    return {"type": "tool_use", "id": call_id, "name": name, "input": {}}


def stop_reason_of(finish_reason: str | None, stop: str | int | None) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) for a chat choice's finish and vLLM's `stop_reason`
    (the stop string that ended it, or a stop token's id)."""
    if finish_reason == "tool_calls":
        return "tool_use", None
    if finish_reason == "length":
        return "max_tokens", None
    if isinstance(stop, str):
        return "stop_sequence", stop
    return "end_turn", None


def _start(message_id: str, model: str, num_prompt_tokens: list[int]) -> dict[str, Any]:
    return {
        "id": message_id, "type": "message", "role": "assistant", "model": model,
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": num_prompt_tokens[0] if num_prompt_tokens else 0,
                  "output_tokens": 0},
    }  # fmt: skip


def event(kind: str, body: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps(body, separators=(',', ':'))}\n\n"
