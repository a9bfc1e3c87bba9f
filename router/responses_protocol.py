"""The OpenAI Responses API's request body (`POST /v1/responses`) and its input items, as
pydantic models.

`input` items and `tools` arrive as plain objects and are read one by one
(`parse_item`, `parse_tool`), so that an item of a type the router does not serve is a
400 that names it and its place, not a union's wall of validation errors. Unknown fields
are ignored, as elsewhere in the router; fields whose silent loss would change the answer
are refused (`tandem.router.responses_api`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tandem.router.errors import InvalidRequest


class InputText(BaseModel):
    type: Literal["input_text", "output_text"]
    text: str


class MessageItem(BaseModel):
    """A message, `type` "message" or none (the SDK's easy input message)."""

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[InputText]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)


class FunctionCallItem(BaseModel):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str  # JSON text


class FunctionCallOutputItem(BaseModel):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[InputText]

    def text(self) -> str:
        if isinstance(self.output, str):
            return self.output
        return "\n".join(part.text for part in self.output)


class ReasoningItem(BaseModel):
    """A reasoning item sent back (as the Agents SDK does): accepted, not rendered."""

    type: Literal["reasoning"]


InputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem
_ITEM_MODELS: dict[str, type[BaseModel]] = {
    "message": MessageItem,
    "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem,
    "reasoning": ReasoningItem,
}


class FunctionTool(BaseModel):
    """Responses' flat function tool."""

    type: Literal["function"]
    name: Annotated[str, Field(pattern=r"^[a-zA-Z0-9_.-]{1,64}$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunction(BaseModel):
    type: Literal["function"]
    name: str


class TextFormat(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    type: Literal["text", "json_object", "json_schema"]
    name: str = "response"
    description: str | None = None
    json_schema: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(BaseModel):
    format: TextFormat | None = None
    verbosity: str | None = None  # accepted, no effect


class ReasoningConfig(BaseModel):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    summary: str | None = None  # accepted: the reasoning is sent whole, as `content`
    generate_summary: str | None = None


class ResponsesRequest(BaseModel):
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    stream: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    reasoning: ReasoningConfig | None = None
    include: list[str] | None = None  # accepted: nothing optional is left out
    truncation: Literal["auto", "disabled"] | None = None
    background: bool | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None


def parse_item(raw: dict[str, Any], param: str) -> InputItem:
    """One `input` item; a type the router does not serve, or a malformed item, is an
    InvalidRequest naming `param`."""
    kind = raw.get("type", "message")
    model = _ITEM_MODELS.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise InvalidRequest(
            f"input items of type {kind!r} are not supported; only message, function_call, "
            "function_call_output and reasoning items are",
            param,
        )
    return _validate(model, raw, param)


def parse_tool(raw: dict[str, Any], param: str) -> FunctionTool:
    """One tool; only function tools are served (the hosted ones, web_search, file_search,
    code_interpreter..., run on OpenAI's side)."""
    kind = raw.get("type")
    if kind != "function":
        raise InvalidRequest(
            f"tools of type {kind!r} are not supported; only function tools are", param
        )
    return _validate(FunctionTool, raw, param)


def _validate(model: type[BaseModel], raw: dict[str, Any], param: str) -> Any:
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        detail = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'item'}: {e['msg']}" for e in exc.errors()
        )
        raise InvalidRequest(f"{param}: {detail}", param) from exc
