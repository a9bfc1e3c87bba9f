"""The Responses API's output shapes: output items (reasoning, message, function_call), the
usage, and the finished response object, built from a chat reply.

Pure functions over plain dicts; `tandem.router.responses_stream` sends them, whole or as
events.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# A response cut by its token budget is "incomplete"; others end "completed".
_INCOMPLETE = frozenset(("length",))


def new_id(prefix: str) -> str:
    """An output item's id: `msg_`, `fc_` or `rs_` and 32 hex digits."""
    return f"{prefix}_{secrets.token_hex(16)}"


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def reasoning_part(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def message_item(item_id: str, parts: list[dict[str, Any]], status: str) -> dict[str, Any]:
    return {
        "type": "message", "id": item_id, "role": "assistant", "status": status,
        "content": parts,
    }  # fmt: skip


def reasoning_item(item_id: str, parts: list[dict[str, Any]], status: str) -> dict[str, Any]:
    return {
        "type": "reasoning", "id": item_id, "summary": [], "content": parts,
        "encrypted_content": None, "status": status,
    }  # fmt: skip


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "type": "function_call", "id": item_id, "call_id": call_id, "name": name,
        "arguments": arguments, "status": status,
    }  # fmt: skip


def output_items(message: dict[str, Any], status: str) -> list[dict[str, Any]]:
    """A chat choice's `message` as output items: its reasoning, its content (an empty
    one only when there is nothing else; without its trailing blanks before calls), its
    calls; the last item has `status`."""
    items = []
    reasoning = message.get("reasoning_content")
    if reasoning:
        items.append(reasoning_item(new_id("rs"), [reasoning_part(reasoning)], "completed"))
    calls = message.get("tool_calls") or []
    content = message.get("content") or ""
    if calls:  # as streamed: the blanks before a call are held back, then never sent
        content = content.rstrip()
    if content or not (items or calls):
        items.append(message_item(new_id("msg"), [text_part(content)], "completed"))
    for call in calls:
        fn = call["function"]
        items.append(call_item(new_id("fc"), call["id"], fn["name"], fn["arguments"], "completed"))
    if items:
        items[-1]["status"] = status
    return items


def item_status(finish_reason: str | None) -> str:
    """The last output item's status."""
    return "incomplete" if finish_reason in _INCOMPLETE else "completed"


@dataclass(frozen=True)
class ReasoningCounter:
    """Counts a reply's reasoning tokens: those up to and including `</think>` where that
    is one token (`end_id`), else the reasoning text encoded again (`encode`); all of a
    reply that never left its reasoning."""

    end_id: int | None
    encode: Callable[[str], list[int]]

    def count(self, token_ids: list[int], reasoning: str, has_answer: bool) -> int:
        if not reasoning:
            return 0
        if not has_answer:
            return len(token_ids)
        if self.end_id is not None and self.end_id in token_ids:
            return token_ids.index(self.end_id) + 1
        return min(len(token_ids), len(self.encode(reasoning)))


def usage(num_input: int, num_output: int, num_cached: int, num_reasoning: int) -> dict[str, Any]:
    return {
        "input_tokens": num_input,
        "input_tokens_details": {"cached_tokens": num_cached, "cache_write_tokens": 0},
        "output_tokens": num_output,
        "output_tokens_details": {"reasoning_tokens": num_reasoning},
        "total_tokens": num_input + num_output,
    }


def finished(
    skeleton: dict[str, Any],
    output: list[dict[str, Any]],
    finish_reason: str | None,
    usage: dict[str, Any],
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The response object once its generation ended (`error`: it failed)."""
    body = {**skeleton, "output": output, "usage": usage}
    if error is not None:
        body.update(status="failed", error=error)
    elif finish_reason in _INCOMPLETE:
        body.update(status="incomplete", incomplete_details={"reason": "max_output_tokens"})
    else:
        body.update(status="completed", completed_at=_now(skeleton))
    return body


def _now(skeleton: dict[str, Any]) -> int:
    return max(int(time.time()), skeleton["created_at"])
