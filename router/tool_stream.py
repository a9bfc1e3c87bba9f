"""What one chat choice with tools has shown its client so far, and what to show next.

Each time its text grows, the text is parsed again (`ToolParser.parse_scan`, whose results
only grow, over one `TextScan` that remembers what earlier pieces taught it, so a piece
costs the characters it adds) and the difference is sent: content, then for each call a
first delta with its id, type and name, then fragments of its arguments. Content that
ends in blanks holds them back until something follows (a reply that turns out to be only
calls after blank lines has no content, as its non-streamed form says).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tandem.router.json_scan import TextScan
from tandem.router.tool_parsers import ParsedOutput, ToolParser


@dataclass
class ToolCallStream:
    """Owned by one choice; `update` advances what was sent."""

    parser: ToolParser
    content_sent: int = 0
    call_ids: list[str] = field(default_factory=list)
    arguments_sent: list[int] = field(default_factory=list)
    scan: TextScan = field(default_factory=TextScan)

    def update(self, text: str, final: bool) -> tuple[str, list[dict[str, Any]]]:
        """(content delta, tool-call delta entries) for the choice's whole text so far
        (which starts with the text of the previous call)."""
        self.scan.extend(text)
        parsed = self.parser.parse_scan(self.scan, final)
        content = visible_content(parsed, final)
        delta = content[self.content_sent :]
        self.content_sent = max(self.content_sent, len(content))
        entries = []
        for index, call in enumerate(parsed.calls):
            if index == len(self.call_ids):
                self.call_ids.append(self.parser.new_call_id())
                self.arguments_sent.append(0)
                entries.append(
                    {
                        "index": index,
                        "id": self.call_ids[index],
                        "type": "function",
                        "function": {"name": call.name, "arguments": ""},
                    }
                )
            fragment = call.arguments[self.arguments_sent[index] :]
            if fragment:
                self.arguments_sent[index] = len(call.arguments)
                entries.append({"index": index, "function": {"arguments": fragment}})
        return delta, entries

    def message_calls(self, parsed: ParsedOutput) -> list[dict[str, Any]]:
        """The calls of a whole reply, as `message.tool_calls`."""
        return [
            {
                "id": self.parser.new_call_id(),
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in parsed.calls
        ]


def visible_content(parsed: ParsedOutput, final: bool) -> str:
    """The content a client sees: while the text grows, without trailing blanks; at the
    end, all of it, unless it is only blanks before calls (then none)."""
    if not final:
        return parsed.content.rstrip()
    if parsed.calls and not parsed.content.strip():
        return ""
    return parsed.content
