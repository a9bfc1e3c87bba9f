"""What a request asks its output to look like, as the one `StructuredOutputsParams` its
choices carry: from `response_format` (`json_object`, `json_schema`), vLLM's
`structured_outputs`, or `tools` with `tool_choice` "required" or a named function (a
grammar for a call in the model's own format). Each spec is compiled here once (and
cached) so a bad one is a 400 naming its field before anything is scheduled; the nodes
compile the same plain data again, each for itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from tandem.engine.structured.grammar import GrammarCompiler, InvalidGrammar
from tandem.engine.structured.spec import StructuredOutputsParams
from tandem.router.errors import InvalidRequest
from tandem.router.protocol import ChatCompletionRequest, SamplingFields
from tandem.router.reasoning_grammar import after_reasoning
from tandem.router.tool_parsers import PARSERS, ToolParser, detect_parser

TOOL_PARSER_CHOICES = ("auto", "none", *PARSERS)


@dataclass(frozen=True)
class ToolUse:
    """A chat request's tools: as the chat template renders them, and the parser that finds
    calls in the reply (None when `tool_choice` is "none": the reply is all content)."""

    tools: list[dict[str, Any]]
    parser: ToolParser | None


class StructuredOutputs:
    """Owns the router's grammar compiler and the model's tool-call parser."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        vocab_size: int,
        eos_token_ids: Sequence[int],
        tool_parser: str = "auto",
    ) -> None:
        if tool_parser not in TOOL_PARSER_CHOICES:
            raise ValueError(f"unknown tool-call parser {tool_parser!r}")
        self.grammars = GrammarCompiler(tokenizer, vocab_size, eos_token_ids)
        name = detect_parser(tokenizer.chat_template) if tool_parser == "auto" else tool_parser
        self.tool_parser = PARSERS[name](tokenizer) if name in PARSERS else None

    def tool_use(self, req: ChatCompletionRequest) -> ToolUse | None:
        """The request's tools, checked against its `tool_choice`. Raises InvalidRequest."""
        choice = req.tool_choice
        if not req.tools:
            if choice not in (None, "none", "auto"):
                raise InvalidRequest(
                    "tool_choice names a tool but no tools are given", "tool_choice"
                )
            return None
        names = {t.function.name for t in req.tools}
        if choice is not None and not isinstance(choice, str) and choice.function.name not in names:
            raise InvalidRequest(
                f"tool_choice names {choice.function.name!r}, which is not in tools", "tool_choice"
            )
        tools = [t.model_dump(exclude_none=True) for t in req.tools]
        if choice == "none":
            return ToolUse(tools, None)
        if self.tool_parser is None:
            raise InvalidRequest(
                "this model's chat template shows no tool-call format; start the router "
                "with --tool-call-parser (hermes, llama3_json or mistral)",
                "tools",
            )
        return ToolUse(tools, self.tool_parser)

    def spec(
        self, req: SamplingFields, tool_use: ToolUse | None = None
    ) -> StructuredOutputsParams | None:
        """The request's one structured-outputs spec, compiled once to check it (None:
        unconstrained). Raises InvalidRequest naming the field at fault."""
        found = [
            (param, spec)
            for param, spec in (
                ("response_format", _from_response_format(req)),
                ("structured_outputs", _from_structured_outputs(req)),
                ("tool_choice", self._from_tools(req, tool_use)),
            )
            if spec is not None
        ]
        if len(found) > 1:
            names = " and ".join(p for p, _ in found)
            raise InvalidRequest(f"{names} cannot be combined", found[1][0])
        if not found:
            return None
        param, spec = found[0]
        try:
            self.grammars.validate(spec)
        except InvalidGrammar as exc:
            raise InvalidRequest(f"{_what(param)}: {exc}", _blame(param)) from exc
        return spec

    def after_reasoning(self, spec: StructuredOutputsParams) -> StructuredOutputsParams:
        """`spec` applied only once the reasoning ends (`</think>`), compiled once to
        check it. Raises InvalidRequest."""
        try:
            grammars = self.grammars
            wrapped = after_reasoning(spec, grammars.tokenizer, grammars.eos_token_ids)
            self.grammars.validate(wrapped)
        except InvalidGrammar as exc:
            raise InvalidRequest(f"the grammar after the reasoning: {exc}") from exc
        return wrapped

    def _from_tools(
        self, req: SamplingFields, tool_use: ToolUse | None
    ) -> StructuredOutputsParams | None:
        choice = getattr(req, "tool_choice", None)
        if tool_use is None or tool_use.parser is None or choice in (None, "auto", "none"):
            return None
        functions = [t.function for t in req.tools]
        if choice != "required":  # a named function: one call of it
            functions = [f for f in functions if f.name == choice.function.name]
        tools = [{"name": f.name, "parameters": f.parameters} for f in functions]
        parallel = req.parallel_tool_calls and choice == "required"
        grammar = tool_use.parser.grammar(tools, parallel=parallel)
        return StructuredOutputsParams(grammar=grammar)


def _from_response_format(req: SamplingFields) -> StructuredOutputsParams | None:
    fmt = req.response_format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return StructuredOutputsParams(json_object=True)
    if fmt.json_schema is None:
        raise InvalidRequest("response_format json_schema needs json_schema", "response_format")
    schema = fmt.json_schema.json_schema
    if schema is False:
        raise InvalidRequest("the JSON schema false admits nothing", "response_format")
    return StructuredOutputsParams(json={} if schema is None or schema is True else schema)


def _from_structured_outputs(req: SamplingFields) -> StructuredOutputsParams | None:
    if req.structured_outputs is None:
        return None
    try:
        return StructuredOutputsParams(**req.structured_outputs.fields())
    except ValueError as exc:
        raise InvalidRequest(str(exc), "structured_outputs") from exc


def _what(param: str) -> str:
    return {"tool_choice": "a tool's parameters"}.get(param, param)


def _blame(param: str) -> str:
    """A grammar built from tools fails on their parameter schemas."""
    return "tools" if param == "tool_choice" else param
