"""Tool calls in the text a model writes, in the formats its family was trained on, and the
grammars that make a model write one (`tool_choice` "required" or a named function).

- `hermes` (Hermes, Qwen2.5, Qwen3): one block per call,
  `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`; text before the first
  block is content.
- `llama3_json` (Llama 3.1-3.3): the whole reply is `{"name": ..., "parameters": {...}}`
  (after an optional `<|python_tag|>`), calls separated by `;`.
- `mistral`: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`.

`parse(text, final)` is a pure function of the text so far, and what it returns only grows
as the text does (content up to the first call, a call once its name is complete, its
arguments as the raw text written so far), so a stream can send differences
(`tandem.router.tool_stream`) and end exactly where the whole text's parse does.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedTokenizerBase

from tandem.router.json_scan import skip_whitespace, value_end

_NAME_FIRST = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # the arguments' JSON text as written (a prefix while it is written)


@dataclass(frozen=True)
class ParsedOutput:
    content: str
    calls: list[ParsedCall] = field(default_factory=list)


class ToolParser:
    """One format. Holds the tokenizer only to name its markers in grammars (a marker that is
    one token of the vocabulary is forced as that token, as the model was trained)."""

    name = ""
    arguments_key = "arguments"
    keeps_special_tokens = False  # the marker is a special token the text must keep

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer

    def parse(self, text: str, final: bool) -> ParsedOutput:
        raise NotImplementedError

    def grammar(self, tools: list[dict[str, Any]], parallel: bool) -> str:
        """A llguidance Lark grammar for one call (or, with `parallel`, one or more) of
        `tools` (each `{"name", "parameters"}`), in this format."""
        raise NotImplementedError

    def new_call_id(self) -> str:
        return f"call_{secrets.token_hex(12)}"

    def _call_schema(self, tools: list[dict[str, Any]]) -> dict[str, Any]:
        """One call object of any of `tools`, its name first (so a stream learns it first)."""
        variants = [
            {
                "type": "object",
                "properties": {
                    "name": {"const": tool["name"]},
                    self.arguments_key: tool.get("parameters") or {"type": "object"},
                },
                "required": ["name", self.arguments_key],
                "additionalProperties": False,
            }
            for tool in tools
        ]
        schema = variants[0] if len(variants) == 1 else {"anyOf": variants}
        # no blanks between JSON tokens, as in response_format (a model may not pad)
        return {**schema, "x-guidance": {"whitespace_flexible": False}}

    def _marker(self, text: str) -> str:
        """`text` as a Lark item: the token itself when the vocabulary has it as one
        added token, else the literal string."""
        if text in self.tokenizer.get_added_vocab():
            return f"<[{self.tokenizer.convert_tokens_to_ids(text)}]>"
        return json.dumps(text)


class HermesParser(ToolParser):
    name = "hermes"
    start, end = "<tool_call>", "</tool_call>"

    def parse(self, text: str, final: bool) -> ParsedOutput:
        first = text.find(self.start)
        if first < 0:
            return ParsedOutput(_without_partial(text, self.start, final))
        calls, pos = [], first
        while (at := text.find(self.start, pos)) >= 0:
            obj = skip_whitespace(text, at + len(self.start))
            if obj >= len(text) or text[obj] != "{":
                pos = obj
                continue
            end = value_end(text, obj)
            call = parse_call(text[obj : end or len(text)], end is not None, self.arguments_key)
            if call is not None:
                calls.append(call)
            if end is None:
                break
            pos = end
        return ParsedOutput(text[:first], calls)

    def grammar(self, tools: list[dict[str, Any]], parallel: bool) -> str:
        start, end = self._marker(self.start), self._marker(self.end)
        repeat = ' ("\\n" call)*' if parallel else ""
        return (
            f"start: call{repeat}\n"
            f'call: {start} "\\n" body "\\n" {end}\n'
            f"body: %json {json.dumps(self._call_schema(tools))}\n"
        )


class Llama3JsonParser(ToolParser):
    name = "llama3_json"
    arguments_key = "parameters"
    tag = "<|python_tag|>"

    def parse(self, text: str, final: bool) -> ParsedOutput:
        pos = skip_whitespace(text, 0)
        rest = text[pos:]
        if rest.startswith(self.tag):
            pos = skip_whitespace(text, pos + len(self.tag))
        elif not final and self.tag.startswith(rest):
            return ParsedOutput("")  # not yet known whether this is a call
        elif not rest.startswith("{"):
            return ParsedOutput(text)
        calls = []
        while pos < len(text) and text[pos] == "{":
            end = value_end(text, pos)
            call = parse_call(text[pos : end or len(text)], end is not None, self.arguments_key)
            if call is None:
                if not calls and (end is not None or final):
                    return ParsedOutput(text)  # a JSON reply that is not a call
                break
            calls.append(call)
            if end is None:
                break
            pos = skip_whitespace(text, end)
            if text.startswith(";", pos):
                pos = skip_whitespace(text, pos + 1)
        return ParsedOutput("", calls)

    def grammar(self, tools: list[dict[str, Any]], parallel: bool) -> str:
        repeat = ' ("; " call)*' if parallel else ""
        return f"start: call{repeat}\ncall: %json {json.dumps(self._call_schema(tools))}\n"


class MistralParser(ToolParser):
    name = "mistral"
    marker = "[TOOL_CALLS]"
    _ID_CHARS = string.ascii_letters + string.digits

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        super().__init__(tokenizer)
        # [TOOL_CALLS] is a control token in Mistral's vocabularies: decoding must keep it
        self.keeps_special_tokens = self.marker in tokenizer.all_special_tokens

    def parse(self, text: str, final: bool) -> ParsedOutput:
        first = text.find(self.marker)
        if first < 0:
            return ParsedOutput(_without_partial(text, self.marker, final))
        calls = []
        pos = skip_whitespace(text, first + len(self.marker))
        if text.startswith("[", pos):
            pos = skip_whitespace(text, pos + 1)
            while pos < len(text) and text[pos] == "{":
                end = value_end(text, pos)
                call = parse_call(text[pos : end or len(text)], end is not None, "arguments")
                if call is not None:
                    calls.append(call)
                if end is None:
                    break
                pos = skip_whitespace(text, end)
                if text.startswith(",", pos):
                    pos = skip_whitespace(text, pos + 1)
        return ParsedOutput(text[:first], calls)

    def grammar(self, tools: list[dict[str, Any]], parallel: bool) -> str:
        call = self._call_schema(tools)
        calls = {
            "type": "array",
            "items": call,
            "minItems": 1,
            "x-guidance": call.pop("x-guidance"),
        }
        if not parallel:
            calls["maxItems"] = 1
        return f"start: {self._marker(self.marker)} calls\ncalls: %json {json.dumps(calls)}\n"

    def new_call_id(self) -> str:
        # Mistral's templates refuse ids other than 9 letters and digits
        return "".join(secrets.choice(self._ID_CHARS) for _ in range(9))


PARSERS: dict[str, type[ToolParser]] = {
    p.name: p for p in (HermesParser, Llama3JsonParser, MistralParser)
}


def detect_parser(chat_template: str | None) -> str | None:
    """The format a chat template teaches its model, from the markers it writes."""
    template = chat_template or ""
    if "<tool_call>" in template:
        return HermesParser.name
    if "[TOOL_CALLS]" in template:
        return MistralParser.name
    if "<|python_tag|>" in template or ("ipython" in template and "parameters" in template):
        return Llama3JsonParser.name
    return None


def parse_call(obj: str, complete: bool, arguments_key: str) -> ParsedCall | None:
    """A call object, whole or still being written: None until its name is known (at once
    when `"name"` is its first key, else once the object is complete and parses). The
    arguments are the raw text of its `arguments_key` value, as far as written."""
    match = _NAME_FIRST.match(obj)
    if match is not None:
        name = json.loads(f'"{match.group(1)}"')
        return ParsedCall(name, _raw_value(obj, match.end(), arguments_key, complete))
    if not complete:
        return None
    try:
        loaded = json.loads(obj)
    except ValueError:
        return None
    if not isinstance(loaded, dict) or not isinstance(loaded.get("name"), str):
        return None
    arguments = json.dumps(loaded.get(arguments_key, {}), ensure_ascii=False)
    return ParsedCall(loaded["name"], arguments)


def _raw_value(obj: str, pos: int, key: str, complete: bool) -> str:
    match = re.compile(rf'"{re.escape(key)}"\s*:\s*').search(obj, pos)
    if match is None:
        return "{}" if complete else ""
    start = match.end()
    end = value_end(obj, start, final=complete)
    return obj[start:end] if end is not None else obj[start:]


def _without_partial(text: str, marker: str, final: bool) -> str:
    """`text`, less an ending that may be the start of `marker` (unless the text is done)."""
    if final:
        return text
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return text[:-size]
    return text
