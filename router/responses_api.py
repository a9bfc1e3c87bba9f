"""The Responses API (`/v1/responses`) on the chat path: a request becomes the chat request
it means (`Turn.chat`: the same chat template, tool parsers, grammars and reasoning
parser), and the chat result becomes a Response (`tandem.router.responses_stream`).

- `instructions` is a system message first; `developer` messages are system messages
  (chat templates know no developer role). `function_call` items become an assistant
  message's `tool_calls` (joined to the assistant message just before them), and
  `function_call_output` items tool messages; `reasoning` items are accepted and not
  rendered.
- `reasoning.effort` "none" turns thinking off (`enable_thinking: false`, or DeepSeek's
  `thinking: false`, whichever variable the chat template reads); any other effort turns
  it on; no `reasoning` leaves the template's default.
- `text.format` shapes text replies: a turn whose `tool_choice` forces a call
  ("required", a named function) is a call, and its format waits for a later turn (the
  chat API would refuse the two together).
- `previous_response_id` continues from a stored response's conversation (its input
  items and its output items; not its `instructions`, as OpenAI).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from tandem.router.errors import InvalidRequest, ResponseNotFound
from tandem.router.generation import Generation
from tandem.router.preprocess import Preprocessor
from tandem.router.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    FunctionCall,
    FunctionDefinition,
    FunctionName,
    JsonSchemaFormat,
    NamedToolChoice,
    ResponseFormat,
    Tool,
    ToolCall,
    ToolChoice,
)
from tandem.router.reasoning import END, thinking_switch
from tandem.router.response_store import ResponseStore
from tandem.router.responses_output import ReasoningCounter
from tandem.router.responses_protocol import (
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionTool,
    InputItem,
    MessageItem,
    NamedFunction,
    ResponsesRequest,
    TextFormat,
    parse_item,
    parse_tool,
)
from tandem.router.responses_stream import ResponsesWriter

# The Responses API's names of engine fields, in error messages.
RESPONSES_NAMES = MappingProxyType({"max_tokens": "max_output_tokens"})


@dataclass(frozen=True)
class Turn:
    """One Responses request, translated: the chat request it runs as, and the
    conversation so far as input items (stored with the response it makes)."""

    chat: ChatCompletionRequest
    items: list[dict[str, Any]]
    skeleton: dict[str, Any]  # the response object but for its output, status and usage
    store: bool


class ResponsesAPI:
    """Owns the store; reads the model's chat template (which thinking switch it has)."""

    def __init__(self, pre: Preprocessor, store: ResponseStore) -> None:
        self.pre = pre
        self.store = store
        self._thinking_switch = thinking_switch(pre.tokenizer)

    def turn(self, req: ResponsesRequest, response_id: str) -> Turn:
        """The request as a chat request. Raises InvalidRequest, or ResponseNotFound for
        an unknown `previous_response_id`."""
        _refuse_unsupported(req)
        items = self._conversation(req)
        messages = _messages(req.instructions, items, len(items) - _num_input(req))
        tools = [parse_tool(t, f"tools.{i}") for i, t in enumerate(req.tools or [])]
        chat = ChatCompletionRequest(
            model=req.model,
            messages=messages,
            max_completion_tokens=req.max_output_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            user=req.user,
            stream=req.stream,
            tools=[_chat_tool(t) for t in tools] or None,
            tool_choice=_tool_choice(req.tool_choice),
            parallel_tool_calls=req.parallel_tool_calls,
            response_format=None if _forces_call(req) else _response_format(req),
            chat_template_kwargs=self._template_kwargs(req),
        )
        echo = [t.model_dump() for t in tools]
        skeleton = _skeleton(req, response_id, self.pre.limits.name, echo)
        return Turn(chat, [item.model_dump() for item in items], skeleton, req.store)

    def writer(self, turn: Turn) -> Callable[[Generation], ResponsesWriter]:
        """What writes the answer of `turn`'s generation (and stores it)."""
        store = self.store if turn.store else None
        end_id = self.pre.tokenizer.get_added_vocab().get(END)
        counter = ReasoningCounter(end_id, lambda text: self.pre.tokenize(text, False))
        return lambda gen: ResponsesWriter(gen, turn.skeleton, turn.items, store, counter)

    def retrieve(self, response_id: str) -> dict[str, Any]:
        """The stored response (a use, for the store's order). Raises ResponseNotFound."""
        found = self.store.get(response_id)
        if found is None:
            raise _not_found(response_id, None)
        return found.body

    def delete(self, response_id: str) -> dict[str, Any]:
        """Forget the response; OpenAI's deletion object. Raises ResponseNotFound."""
        if not self.store.delete(response_id):
            raise _not_found(response_id, None)
        return {"id": response_id, "object": "response", "deleted": True}

    def _conversation(self, req: ResponsesRequest) -> list[InputItem]:
        """The stored conversation `previous_response_id` names, then this input's items."""
        items: list[InputItem] = []
        if req.previous_response_id is not None:
            found = self.store.get(req.previous_response_id)
            if found is None:
                raise _not_found(req.previous_response_id, "previous_response_id")
            items = [parse_item(raw, "previous_response_id") for raw in found.items]
        if isinstance(req.input, str):
            return [*items, MessageItem(role="user", content=req.input)]
        return items + [parse_item(raw, f"input.{i}") for i, raw in enumerate(req.input)]

    def _template_kwargs(self, req: ResponsesRequest) -> dict[str, Any] | None:
        effort = req.reasoning.effort if req.reasoning is not None else None
        if effort is None or self._thinking_switch is None:
            return None
        return {self._thinking_switch: effort != "none"}


def _refuse_unsupported(req: ResponsesRequest) -> None:
    """Fields whose silent loss would change the answer."""
    refused = {
        "background": "background responses are not supported",
        "conversation": "conversations are not supported; use previous_response_id",
        "prompt": "prompt templates are not supported",
    }
    for name, message in refused.items():
        if getattr(req, name):
            raise InvalidRequest(message, name)
    if req.truncation == "auto":
        raise InvalidRequest("truncation auto is not supported; only disabled", "truncation")


def _num_input(req: ResponsesRequest) -> int:
    return 1 if isinstance(req.input, str) else len(req.input)


def _messages(instructions: str | None, items: list[InputItem], first: int) -> list[ChatMessage]:
    """Chat messages for the conversation; `first` is the index of this request's first
    input item (errors name `input.<i>` from there)."""
    messages = [ChatMessage(role="system", content=instructions)] if instructions else []
    call_ids: set[str] = set()
    for index, item in enumerate(items):
        param = f"input.{index - first}" if index >= first else "previous_response_id"
        if isinstance(item, MessageItem):
            role = "system" if item.role == "developer" else item.role
            messages.append(ChatMessage(role=role, content=item.text()))
        elif isinstance(item, FunctionCallItem):
            _add_call(messages, item, param)
            call_ids.add(item.call_id)
        elif isinstance(item, FunctionCallOutputItem):
            if item.call_id not in call_ids:
                raise InvalidRequest(
                    f"no function_call with call_id {item.call_id!r} comes before this "
                    "function_call_output",
                    f"{param}.call_id",
                )
            messages.append(
                ChatMessage(role="tool", tool_call_id=item.call_id, content=item.text())
            )
    if not messages:
        raise InvalidRequest("input must not be empty", "input")
    return messages


def _add_call(messages: list[ChatMessage], item: FunctionCallItem, param: str) -> None:
    """The call joins the assistant message just before it, else starts one."""
    try:
        json.loads(item.arguments)
    except ValueError as exc:
        raise InvalidRequest(f"arguments must be JSON: {exc}", f"{param}.arguments") from exc
    call = ToolCall(
        id=item.call_id, function=FunctionCall(name=item.name, arguments=item.arguments)
    )
    last = messages[-1] if messages else None
    if last is not None and last.role == "assistant":
        last.tool_calls = [*(last.tool_calls or []), call]
    else:
        messages.append(ChatMessage(role="assistant", content=None, tool_calls=[call]))


def _chat_tool(tool: FunctionTool) -> Tool:
    """Responses' flat function tool in chat's shape (`{"type", "function": {...}}`)."""
    return Tool(type="function", function=FunctionDefinition(**tool.model_dump(exclude={"type"})))


def _tool_choice(choice: str | dict[str, Any] | None) -> ToolChoice | None:
    if choice is None or isinstance(choice, str):
        return choice
    if choice.get("type") != "function":
        raise InvalidRequest(
            f"tool_choice of type {choice.get('type')!r} is not supported; only auto, none, "
            "required and a function",
            "tool_choice",
        )
    named = _parse_named(choice)
    return NamedToolChoice(type="function", function=FunctionName(name=named.name))


def _parse_named(choice: dict[str, Any]) -> NamedFunction:
    try:
        return NamedFunction.model_validate(choice)
    except ValueError as exc:
        raise InvalidRequest("tool_choice needs the function's name", "tool_choice") from exc


def _forces_call(req: ResponsesRequest) -> bool:
    """Whether `tool_choice` makes the reply a call, so `text.format` (for text) has
    nothing to shape in it."""
    return bool(req.tools) and (req.tool_choice == "required" or isinstance(req.tool_choice, dict))


def _response_format(req: ResponsesRequest) -> ResponseFormat | None:
    fmt = req.text.format if req.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return ResponseFormat(type="json_object")
    schema = JsonSchemaFormat(name=fmt.name, schema=fmt.json_schema, strict=fmt.strict)
    return ResponseFormat(type="json_schema", json_schema=schema)


def _skeleton(
    req: ResponsesRequest, response_id: str, model: str, tools: list[dict[str, Any]]
) -> dict[str, Any]:
    """The response object's fields that echo the request."""
    fmt = req.text.format if req.text is not None and req.text.format else None
    return {
        "id": response_id, "object": "response", "created_at": int(time.time()),
        "status": "in_progress", "background": False, "error": None,
        "incomplete_details": None, "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens, "metadata": req.metadata or {},
        "model": model, "output": [], "parallel_tool_calls": req.parallel_tool_calls,
        "previous_response_id": req.previous_response_id,
        "reasoning": _echo(req.reasoning, {"effort": None, "summary": None}),
        "store": req.store, "temperature": req.temperature,
        "text": {"format": _format_echo(fmt)},
        "tool_choice": req.tool_choice or "auto", "tools": tools, "top_p": req.top_p,
        "truncation": "disabled", "usage": None, "user": req.user,
    }  # fmt: skip


def _format_echo(fmt: TextFormat | None) -> dict[str, Any]:
    if fmt is None or fmt.type != "json_schema":
        return {"type": fmt.type if fmt is not None else "text"}
    return _echo(fmt, {})


def _echo(model: Any, default: Mapping[str, Any]) -> dict[str, Any]:
    return dict(default) if model is None else model.model_dump(by_alias=True, exclude_none=True)


def _not_found(response_id: str, param: str | None) -> ResponseNotFound:
    return ResponseNotFound(f"Response with id {response_id!r} not found.", param)
