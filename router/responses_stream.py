"""A chat generation written as a Responses API answer: the Response object, or its stream
of typed events (`event: <type>` and `data: {...}` with `sequence_number`s from 0).

The stream is made of the chat stream's own deltas (`ChatFormat.deltas`: reasoning,
content held back while it may start a tool call, each call's name then argument
fragments), so what it sends is exactly what a chat client would see:

    response.created, response.in_progress,
    per output item: response.output_item.added,
      reasoning: content_part.added, reasoning_text.delta..., reasoning_text.done,
                 content_part.done
      message:   content_part.added, output_text.delta..., output_text.done,
                 content_part.done
      function_call: function_call_arguments.delta..., function_call_arguments.done
    response.output_item.done,
    then response.completed or response.incomplete (cut by max_output_tokens), whose
    response is the one stored; or response.failed when the generation failed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tandem.router.errors import APIError
from tandem.router.generation import Generation
from tandem.router.response_store import ResponseStore, StoredResponse
from tandem.router.responses_output import (
    ReasoningCounter,
    call_item,
    finished,
    item_status,
    message_item,
    new_id,
    output_items,
    reasoning_item,
    reasoning_part,
    text_part,
    usage,
)


@dataclass
class _OpenItem:
    """The output item being streamed."""

    kind: str  # "reasoning", "message" or "function_call"
    index: int  # its output_index
    item_id: str
    text: str = ""  # its text, or its call's arguments
    call: dict[str, Any] = field(default_factory=dict)  # function_call: call_id, name


class ResponsesWriter:
    """Writes one generation (one chat choice) as a Response, and stores the finished
    response (with the conversation `items` it ends) when given a `store`."""

    def __init__(
        self,
        gen: Generation,
        skeleton: dict[str, Any],
        items: list[dict[str, Any]],
        store: ResponseStore | None,
        counter: ReasoningCounter,
    ) -> None:
        self.gen = gen
        self.skeleton = skeleton
        self.items = items
        self.store = store
        self.counter = counter
        self.num_sent = 0  # the next sequence_number
        self.output: list[dict[str, Any]] = []  # finished items, in order
        self.open: _OpenItem | None = None

    # -- whole ------------------------------------------------------------------------

    def whole(self) -> dict[str, Any]:
        state = self.gen.states[0]
        message = self.gen.fmt.choice(state)["message"]
        return self._finish(output_items(message, item_status(state.finish_reason)))

    # -- streamed ---------------------------------------------------------------------

    def start(self) -> list[str]:
        return [
            self._event("response.created", response=self.skeleton),
            self._event("response.in_progress", response=self.skeleton),
        ]

    def record(self, index: int, record: dict[str, Any]) -> list[str]:
        texts = []
        for choice in self.gen.fmt.deltas(self.gen.states[index], record, False):
            delta = choice["delta"]
            if delta.get("reasoning_content"):
                texts += self._text("reasoning", delta["reasoning_content"])
            content = delta.get("content")
            if content and not (self._called() and content.isspace()):
                texts += self._text("message", content)
            for entry in delta.get("tool_calls") or []:
                texts += self._call(entry)
        return texts

    def done(self) -> list[str]:
        finish = self.gen.states[0].finish_reason
        texts = [] if self.output or self.open else self._open("message", {})
        texts += self._close(item_status(finish))
        body = self._finish(self.output)
        kind = "response.completed" if body["status"] == "completed" else "response.incomplete"
        return [*texts, self._event(kind, response=body)]

    def failed(self, error: APIError) -> list[str]:
        texts = self._close("incomplete")
        failure = {"code": "server_error", "message": error.message}
        body = self._finish(self.output, failure)
        return [*texts, self._event("response.failed", response=body)]

    # -- items ------------------------------------------------------------------------

    def _text(self, kind: str, delta: str) -> list[str]:
        texts = [] if self.open is not None and self.open.kind == kind else self._reopen(kind)
        item = self.open
        item.text += delta
        if kind == "message":
            return [*texts, self._event("response.output_text.delta", **self._where(),
                                        content_index=0, delta=delta, logprobs=[])]  # fmt: skip
        return [*texts, self._event("response.reasoning_text.delta", **self._where(),
                                    content_index=0, delta=delta)]  # fmt: skip

    def _call(self, entry: dict[str, Any]) -> list[str]:
        texts = []
        if "id" in entry:  # a call's first delta: its id and name
            call = {"call_id": entry["id"], "name": entry["function"]["name"]}
            texts = self._close("completed") + self._open("function_call", call)
        fragment = entry["function"].get("arguments") or ""
        if fragment:
            self.open.text += fragment
            texts.append(self._event("response.function_call_arguments.delta", **self._where(),
                                     delta=fragment))  # fmt: skip
        return texts

    def _called(self) -> bool:
        """Whether a call began: content after it is only the blanks that ended the text
        before it (held back while the text grew), which the message, done, goes without."""
        items = [*self.output, *([] if self.open is None else [{"type": self.open.kind}])]
        return any(item["type"] == "function_call" for item in items)

    def _reopen(self, kind: str) -> list[str]:
        return self._close("completed") + self._open(kind, {})

    def _open(self, kind: str, call: dict[str, Any]) -> list[str]:
        prefix = {"reasoning": "rs", "message": "msg", "function_call": "fc"}[kind]
        self.open = _OpenItem(kind, len(self.output), new_id(prefix), call=call)
        texts = [self._event("response.output_item.added", output_index=self.open.index,
                             item=self._item("in_progress", empty=True))]  # fmt: skip
        if kind != "function_call":
            part = text_part("") if kind == "message" else reasoning_part("")
            texts.append(self._event("response.content_part.added", **self._where(),
                                     content_index=0, part=part))  # fmt: skip
        return texts

    def _close(self, status: str) -> list[str]:
        """The open item's done events (none open: none)."""
        item = self.open
        if item is None:
            return []
        where = self._where()
        if item.kind == "function_call":
            texts = [self._event("response.function_call_arguments.done", **where,
                                 name=item.call["name"], arguments=item.text)]  # fmt: skip
        else:
            done_type = "output_text" if item.kind == "message" else "reasoning_text"
            extra = {"logprobs": []} if item.kind == "message" else {}
            part = text_part(item.text) if item.kind == "message" else reasoning_part(item.text)
            texts = [
                self._event(f"response.{done_type}.done", **where, content_index=0,
                            text=item.text, **extra),
                self._event("response.content_part.done", **where, content_index=0, part=part),
            ]  # fmt: skip
        whole = self._item(status)
        self.output.append(whole)
        self.open = None
        texts.append(self._event("response.output_item.done", output_index=item.index, item=whole))
        return texts

    def _item(self, status: str, empty: bool = False) -> dict[str, Any]:
        item = self.open
        if item.kind == "function_call":
            arguments = "" if empty else item.text
            call_id, name = item.call["call_id"], item.call["name"]
            return call_item(item.item_id, call_id, name, arguments, status)
        if item.kind == "message":
            return message_item(item.item_id, [] if empty else [text_part(item.text)], status)
        return reasoning_item(item.item_id, [] if empty else [reasoning_part(item.text)], status)

    def _where(self) -> dict[str, Any]:
        return {"item_id": self.open.item_id, "output_index": self.open.index}

    # -- the end ----------------------------------------------------------------------

    def _finish(
        self, output: list[dict[str, Any]], error: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The finished response, stored when asked."""
        gen, state = self.gen, self.gen.states[0]
        reasoning = "".join(_texts(output, "reasoning"))
        answered = any(item["type"] != "reasoning" and _has_text(item) for item in output)
        num_reasoning = self.counter.count(state.token_ids, reasoning, answered)
        num_output = state.completion_tokens or len(state.token_ids)
        used = usage(gen.num_prompt_tokens, num_output, gen.num_cached_tokens, num_reasoning)
        body = finished(self.skeleton, output, state.finish_reason, used, error)
        if self.store is not None:
            self.store.put(StoredResponse(body, [*self.items, *output]))
        return body

    def _event(self, kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": self.num_sent, **fields}
        self.num_sent += 1
        return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def _texts(output: list[dict[str, Any]], kind: str) -> list[str]:
    return [part["text"] for item in output if item["type"] == kind for part in item["content"]]


def _has_text(item: dict[str, Any]) -> bool:
    """Whether an item holds any answer: a call, or a message with text."""
    if item["type"] == "function_call":
        return True
    return any(part["text"] for part in item.get("content", []))
