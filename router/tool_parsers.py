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
(`tandem.router.tool_stream`) and end exactly where the whole text's parse does. A stream
parses with `parse_scan` over one `TextScan` that keeps what earlier pieces taught it, so
each piece costs the characters it adds, not the whole text again. Malformed output never
raises: `tandem.router.tool_call` says what becomes of it.
"""

from __future__ import annotations

import json
import secrets
import string
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedTokenizerBase

from tandem.router.json_scan import TextScan
from tandem.router.tool_call import ParsedCall, parse_call


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
        """The reply's content and calls, from its whole text so far. Never raises."""
        return self.parse_scan(TextScan(text), final)

    def parse_scan(self, scan: TextScan, final: bool) -> ParsedOutput:
        """`parse` of `scan.text`, reusing what `scan` learnt from shorter texts."""
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

    def parse_scan(self, scan: TextScan, final: bool) -> ParsedOutput:
        text = scan.text
        first = scan.find(self.start, 0)
        if first < 0:
            return ParsedOutput(_without_partial(text, self.start, final))
        calls, pos = [], first
        while (at := scan.find(self.start, pos)) >= 0:
            obj = scan.skip_whitespace(at + len(self.start))
            if obj >= len(text) or text[obj] != "{":
                pos = obj
                continue
            end = scan.value_end(obj)
            call = parse_call(scan, obj, end, self.arguments_key)
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

    def parse_scan(self, scan: TextScan, final: bool) -> ParsedOutput:
        text = scan.text
        pos = scan.skip_whitespace(0)
        if text.startswith(self.tag, pos):
            pos = scan.skip_whitespace(pos + len(self.tag))
        elif not final and len(text) - pos < len(self.tag) and self.tag.startswith(text[pos:]):
            return ParsedOutput("")  # not yet known whether this is a call
        elif not text.startswith("{", pos):
            return ParsedOutput(text)
        calls = []
        while pos < len(text) and text[pos] == "{":
            end = scan.value_end(pos)
            call = parse_call(scan, pos, end, self.arguments_key)
            if call is None:
                if not calls and (end is not None or final):
                    return ParsedOutput(text)  # a JSON reply that is not a call
                break
            calls.append(call)
            if end is None:
                break
            pos = scan.skip_whitespace(end)
            if text.startswith(";", pos):
                pos = scan.skip_whitespace(pos + 1)
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

    def parse_scan(self, scan: TextScan, final: bool) -> ParsedOutput:
        text = scan.text
        first = scan.find(self.marker, 0)
        if first < 0:
            return ParsedOutput(_without_partial(text, self.marker, final))
        calls = []
        pos = scan.skip_whitespace(first + len(self.marker))
        if text.startswith("[", pos):
            pos = scan.skip_whitespace(pos + 1)
            while pos < len(text) and text[pos] == "{":
                end = scan.value_end(pos)
                call = parse_call(scan, pos, end, self.arguments_key)
                if call is not None:
                    calls.append(call)
                if end is None:
                    break
                pos = scan.skip_whitespace(end)
                if text.startswith(",", pos):
                    pos = scan.skip_whitespace(pos + 1)
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


def _without_partial(text: str, marker: str, final: bool) -> str:
    """`text`, less an ending that may be the start of `marker` (unless the text is done)."""
    if final:
        return text
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return text[:-size]
    return text
