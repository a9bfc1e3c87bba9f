"""Where a JSON value ends in text that may still be growing (a streamed tool call): enough
of a scanner to find the end of an object, array, string or literal without parsing it."""

from __future__ import annotations

import re

_WHITESPACE = " \t\r\n"
# A number or a literal ends at the first character that cannot continue it.
_ATOM = re.compile(r"[-+0-9.eE]+|true|false|null")


def skip_whitespace(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in _WHITESPACE:
        pos += 1
    return pos


def value_end(text: str, start: int, final: bool = False) -> int | None:
    """The index just past the JSON value that starts at `text[start]`, or None when the
    text ends first (with `final`, an atom that reaches the end is complete). A malformed
    value ends where its brackets balance; parsing it is the caller's business."""
    if start >= len(text):
        return None
    first = text[start]
    if first in "{[":
        return _container_end(text, start)
    if first == '"':
        return _string_end(text, start)
    match = _ATOM.match(text, start)
    if match is None:
        return start + 1  # not JSON: one character, so the caller moves on
    end = match.end()
    return end if end < len(text) or final else None


def _container_end(text: str, start: int) -> int | None:
    depth = 0
    pos = start
    while pos < len(text):
        char = text[pos]
        if char == '"':
            end = _string_end(text, pos)
            if end is None:
                return None
            pos = end
            continue
        if char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0:
                return pos + 1
        pos += 1
    return None


def _string_end(text: str, start: int) -> int | None:
    pos = start + 1
    while pos < len(text):
        char = text[pos]
        if char == "\\":
            pos += 2
            continue
        if char == '"':
            return pos + 1
        pos += 1
    return None
