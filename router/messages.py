"""Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`) as a
translation onto the chat path: a request becomes a `ChatCompletionRequest` (the same
template, tool parser, grammars, reasoning parser, routing and disaggregation), and the
chat answer becomes a `message` (or its stream of events, `tandem.router.messages_stream`).

- `system` becomes a system message; a user turn's `tool_result` blocks become tool
  messages (before its text), an assistant turn's `tool_use` blocks its `tool_calls`.
  A `tool_result` must answer a `tool_use` of an earlier assistant turn.
- `tools` become functions (`input_schema` their parameters); `tool_choice` `auto`,
  `any`, `tool`, `none` become "auto", "required", a named function, "none";
  `disable_parallel_tool_use` turns `parallel_tool_calls` off.
- `thinking: {"type": "disabled"}` renders the template with its thinking switch
  (`enable_thinking`, or DeepSeek's `thinking`) false, any other type with it true;
  the reply's reasoning comes back as `thinking` blocks.
- `stop_reason`: `tool_use` (calls), `stop_sequence` (with `stop_sequence` set),
  `max_tokens`, else `end_turn`; `usage` counts the prompt's tokens and the reply's.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from fastapi import Request as HttpRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from tandem.router.anthropic_protocol import (
    Message,
    MessagesInput,
    MessagesRequest,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from tandem.router.errors import InvalidRequest, anthropic_error, is_anthropic
from tandem.router.messages_stream import message_events, stop_reason_of, tool_use_block
from tandem.router.protocol import ChatCompletionRequest
from tandem.router.reasoning import thinking_switch

if TYPE_CHECKING:
    from tandem.router.app import Router

_TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


class MessagesAPI:
    """The Messages endpoints of one router (its chat path does the work)."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.switch = thinking_switch(router.pre.tokenizer) or "enable_thinking"

    async def respond(self, req: MessagesRequest, http: HttpRequest) -> Response:
        """The message, or its event stream. Raises APIError (shaped by `errors_shaped`)."""
        chat = to_chat(req, self.switch)
        built: list[int] = []  # the prompt's token count, once the generation is built
        answer = await self.router.respond_chat(
            chat, http, lambda gen: built.append(gen.num_prompt_tokens)
        )
        message_id = f"msg_{uuid.uuid4().hex}"
        if chat.stream:
            chunks = answer.body_iterator
            answer.body_iterator = message_events(chunks, message_id, req.model, built)
            return answer
        if answer.status_code != 200:  # the client went away (499)
            return answer
        return JSONResponse(message_body(json.loads(answer.body), message_id))

    async def count_tokens(self, req: MessagesInput) -> Response:
        """`{"input_tokens": N}`: the prompt a request with this input would have."""
        self.router.check_model(req.model)
        chat = to_chat(req, self.switch)
        pre = self.router.pre

        def count() -> int:
            return len(pre.chat_prompt(chat, pre.structured.tool_use(chat)).token_ids)

        return JSONResponse({"input_tokens": await self.router.cpu.run(count)})


def to_chat(req: MessagesInput, switch: str = "enable_thinking") -> ChatCompletionRequest:
    """The chat request that serves `req`; `switch`: the template's thinking variable.
    Raises InvalidRequest."""
    body: dict[str, Any] = {
        "model": req.model,
        "messages": _chat_messages(req),
        "tools": [_function(tool) for tool in req.tools] if req.tools else None,
        "tool_choice": _tool_choice(req),
    }
    if req.messages[-1].role == "assistant":  # a prefill: the reply goes on with it
        body.update(add_generation_prompt=False, continue_final_message=True)
    if req.tool_choice is not None and req.tool_choice.disable_parallel_tool_use:
        body["parallel_tool_calls"] = False
    if req.thinking is not None:
        body["chat_template_kwargs"] = {switch: req.thinking.type != "disabled"}
    if isinstance(req, MessagesRequest):
        body.update(
            max_tokens=req.max_tokens, stop=req.stop_sequences, temperature=req.temperature,
            top_p=req.top_p, top_k=req.top_k, stream=req.stream,
            stream_options={"include_usage": True} if req.stream else None,
        )  # fmt: skip
        output = req.output_config.format if req.output_config is not None else None
        if output is not None:
            schema = {"name": "output", "schema": output.output_schema}
            body["response_format"] = {"type": "json_schema", "json_schema": schema}
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:  # what only the chat request's rules refuse
        raise InvalidRequest(str(exc.errors()[0]["msg"]), "messages") from exc


def _chat_messages(req: MessagesInput) -> list[dict[str, Any]]:
    system = req.system_text()
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    tool_use_ids: set[str] = set()
    for index, message in enumerate(req.messages):
        if message.role == "assistant":
            messages.append(_assistant(message, index, tool_use_ids))
        else:
            messages += _user(message, index, tool_use_ids)
    return messages


def _assistant(message: Message, index: int, tool_use_ids: set[str]) -> dict[str, Any]:
    text, calls = [], []
    for j, block in enumerate(message.blocks()):
        if isinstance(block, TextBlock):
            text.append(block.text)
        elif isinstance(block, ToolUseBlock):
            tool_use_ids.add(block.id)
            arguments = json.dumps(block.input, ensure_ascii=False)
            calls.append({"id": block.id, "function": {"name": block.name, "arguments": arguments}})
        elif isinstance(block, ToolResultBlock):
            raise InvalidRequest(
                "tool_result blocks belong in user turns", f"messages.{index}.content.{j}"
            )
    return {"role": "assistant", "content": "".join(text) or None, "tool_calls": calls or None}


def _user(message: Message, index: int, tool_use_ids: set[str]) -> list[dict[str, Any]]:
    results, text = [], []
    for j, block in enumerate(message.blocks()):
        where = f"messages.{index}.content.{j}"
        if isinstance(block, ToolResultBlock):
            if block.tool_use_id not in tool_use_ids:
                raise InvalidRequest(
                    f"tool_result answers tool_use id {block.tool_use_id!r}, which no earlier "
                    "assistant turn has",
                    f"{where}.tool_use_id",
                )
            results.append(
                {"role": "tool", "tool_call_id": block.tool_use_id, "content": block.text()}
            )
        elif isinstance(block, ToolUseBlock):
            raise InvalidRequest("tool_use blocks belong in assistant turns", where)
        elif isinstance(block, TextBlock):
            text.append(block.text)
    return results + ([{"role": "user", "content": "\n".join(text)}] if text else [])


def _function(tool: Any) -> dict[str, Any]:
    function = {"name": tool.name, "parameters": tool.input_schema}
    if tool.description is not None:
        function["description"] = tool.description
    return {"type": "function", "function": function}


def _tool_choice(req: MessagesInput) -> Any:
    choice = req.tool_choice
    if choice is None:
        return None
    if choice.type != "tool":
        return _TOOL_CHOICES[choice.type]
    if not choice.name:
        raise InvalidRequest("tool_choice of type tool needs the tool's name", "tool_choice")
    return {"type": "function", "function": {"name": choice.name}}


def message_body(chat: dict[str, Any], message_id: str) -> dict[str, Any]:
    """A `chat.completion` body (one choice, with usage) as a `message`."""
    (choice,) = chat["choices"]
    reply = choice["message"]
    content: list[dict[str, Any]] = []
    if reply.get("reasoning_content"):
        content.append(
            {"type": "thinking", "thinking": reply["reasoning_content"], "signature": ""}
        )
    if reply.get("content"):
        content.append({"type": "text", "text": reply["content"]})
    for call in reply.get("tool_calls") or []:
        content.append(tool_use_block(call["id"], call["function"]["name"]))
        content[-1]["input"] = _input(call["function"]["arguments"])
    stop_reason, stop_sequence = stop_reason_of(choice["finish_reason"], choice["stop_reason"])
    usage = chat["usage"]
    return {
        "id": message_id, "type": "message", "role": "assistant", "model": chat["model"],
        "content": content, "stop_reason": stop_reason, "stop_sequence": stop_sequence,
        "usage": {"input_tokens": usage["prompt_tokens"],
                  "output_tokens": usage["completion_tokens"]},
    }  # fmt: skip


def _input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the block's `input`: an object, or (the model wrote something
    else) that text under `"arguments"`, so nothing it wrote is lost."""
    try:
        value = json.loads(arguments)
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {"arguments": arguments}


def add_anthropic_error_shapes(app: FastAPI) -> None:
    """Answer the Messages paths' validation and HTTP errors (a bad body, a wrong method)
    in Anthropic's shape: wraps the app's OpenAI-shaped handlers, registered before."""
    for exc_class in (RequestValidationError, StarletteHTTPException):
        app.add_exception_handler(exc_class, _reshaped(app.exception_handlers[exc_class]))


def _reshaped(openai_handler: Callable) -> Callable:
    async def handler(request: HttpRequest, exc: Exception) -> Response:
        response = await openai_handler(request, exc)
        if not is_anthropic(request.url.path):
            return response
        message = json.loads(response.body)["error"]["message"]
        kept = {k: v for k, v in response.headers.items() if k in ("allow", "retry-after")}
        return anthropic_error(response.status_code, message, kept or None)

    return handler
