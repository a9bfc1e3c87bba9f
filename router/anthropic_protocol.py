"""The Anthropic Messages API request bodies the router accepts, as pydantic models.

Field names are Anthropic's. Content blocks are told apart by their `type`; a block type
the router cannot serve (images, documents, server tools' blocks) fails validation, a 400
that names it. Unknown fields (`metadata`, `cache_control`, `service_tier`...) are ignored,
as unknown fields of the OpenAI bodies are.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field


class TextBlock(BaseModel):
    type: Literal["text"]
    text: str


class ToolUseBlock(BaseModel):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(BaseModel):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] | None = None
    is_error: bool = False

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "\n".join(block.text for block in self.content)


class ThinkingBlock(BaseModel):
    """A reply's reasoning, sent back in a later turn: the chat templates drop the
    reasoning of earlier turns, and so does the router."""

    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(BaseModel):
    type: Literal["redacted_thinking"]
    data: str


ContentBlock = Annotated[
    TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock,
    Field(discriminator="type"),
]


class Message(BaseModel):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]

    def blocks(self) -> list[ContentBlock]:
        if isinstance(self.content, str):
            return [TextBlock(type="text", text=self.content)]
        return self.content


class ToolDefinition(BaseModel):
    name: Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None


class ToolChoice(BaseModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None  # type "tool"
    disable_parallel_tool_use: bool = False


class ThinkingConfig(BaseModel):
    """`disabled` turns the template's thinking off; any other type (`enabled`,
    `adaptive`...) leaves it on. `budget_tokens` is not enforced: `max_tokens` bounds the
    reasoning and the answer together."""

    type: str
    budget_tokens: int | None = None


class JsonOutputFormat(BaseModel):
    type: Literal["json_schema"]
    output_schema: dict[str, Any] = Field(alias="schema")


class OutputConfig(BaseModel):
    """Anthropic's structured outputs: the reply is JSON under `format`'s schema (enforced
    as a chat request's `response_format` is). `effort` is ignored."""

    format: JsonOutputFormat | None = None


class MessagesInput(BaseModel):
    """What a reply's prompt is made of (`/v1/messages/count_tokens` takes this alone)."""

    model: str
    messages: Annotated[list[Message], Field(min_length=1)]
    system: str | list[TextBlock] | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None

    def system_text(self) -> str | None:
        if self.system is None or isinstance(self.system, str):
            return self.system or None
        return "\n".join(block.text for block in self.system) or None


class MessagesRequest(MessagesInput):
    max_tokens: int
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool = False
    output_config: OutputConfig | None = None
