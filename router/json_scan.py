"""A growing text (a streamed reply) and what has been learnt about it: where a marker is,
where blanks end, where a JSON value ends. Enough of a JSON scanner to find the end of an
object, array, string or literal without parsing it.

Every answer is remembered with how far its scan got, and a later question about a longer
text resumes there, so streaming a reply piece by piece scans each character a bounded
number of times, not once per piece. `num_scanned` counts the characters examined (by
Python or by `str.find`), for tests and benchmarks to check that the work stays linear.
"""

from __future__ import annotations

from dataclasses import dataclass

_WHITESPACE = " \t\r\n"
_NUMBER = frozenset("-+0123456789.eE")
_LITERALS = ("true", "false", "null")


@dataclass
class _Search:
    """One `find` in progress: the match, or how far it has looked."""

    found: int = -1
    searched_to: int = 0


@dataclass
class _Value:
    """One value's scan in progress: the next character to read and the state there."""

    pos: int
    depth: int = 0
    in_string: bool = False
    end: int | None = None  # known once the value closed


class TextScan:
    """Owned by one reply's parse. The text may only grow: each `extend` gets a text that
    starts with the one before (a streamed reply)."""

    def __init__(self, text: str = "") -> None:
        self.text = text
        self.num_scanned = 0
        self._searches: dict[tuple[str, int], _Search] = {}
        self._blanks: dict[int, int] = {}  # start -> first position not yet known blank
        self._values: dict[int, _Value] = {}
        self.memo: dict[object, object] = {}  # the parser's results about closed spans

    def extend(self, text: str) -> None:
        assert len(text) >= len(self.text), "a streamed text only grows"
        self.text = text

    def find(self, marker: str, start: int) -> int:
        """`text.find(marker, start)`, looking only at what it has not looked at before."""
        search = self._searches.setdefault((marker, start), _Search(searched_to=start))
        if search.found >= 0:
            return search.found
        begin = max(start, search.searched_to - len(marker) + 1)
        search.found = self.text.find(marker, begin)
        reached = len(self.text) if search.found < 0 else search.found + len(marker)
        self.num_scanned += max(0, reached - begin)
        search.searched_to = reached
        return search.found

    def skip_whitespace(self, start: int) -> int:
        """The first position at or after `start` that is not a blank (or the text's end)."""
        pos = self._blanks.get(start, start)
        text = self.text
        while pos < len(text) and text[pos] in _WHITESPACE:
            pos += 1
        self.num_scanned += pos - self._blanks.get(start, start) + 1
        self._blanks[start] = pos
        return pos

    def value_end(self, start: int, final: bool = False) -> int | None:
        """The index just past the JSON value that starts at `text[start]`, or None when the
        text ends first (with `final`, a number or literal that reaches the end is
        complete). A malformed value ends where its brackets balance; parsing it is the
        caller's business; what is not JSON at all is one character long."""
        if start >= len(self.text):
            return None
        value = self._values.get(start)
        if value is None:
            value = self._values[start] = self._start(start)
        if value.end is None:
            first = self.text[start]
            if first in _NUMBER:
                self._number(value)
            elif first in '{["':
                self._container(value)
            else:
                self._literal(value, start)
        if value.end is None and final and self.text[start] in _NUMBER:
            return len(self.text)
        return value.end

    def _start(self, start: int) -> _Value:
        if self.text[start] == '"':
            return _Value(start + 1, in_string=True)
        return _Value(start)

    def _number(self, value: _Value) -> None:
        text, pos = self.text, value.pos
        while pos < len(text) and text[pos] in _NUMBER:
            pos += 1
        self.num_scanned += pos - value.pos
        value.pos = pos
        if pos < len(text):
            value.end = pos

    def _literal(self, value: _Value, start: int) -> None:
        """`true`, `false` or `null`: complete when the text holds all of it; any other
        character (or a literal's misspelling) is not JSON: one character."""
        text = self.text
        for literal in _LITERALS:
            if text.startswith(literal, start):
                value.end = start + len(literal)
                return
            if literal.startswith(text[start : start + len(literal)]) and (
                len(text) - start < len(literal)
            ):
                return  # may still become this literal
        value.end = start + 1

    def _container(self, value: _Value) -> None:
        """An object, array or string: resume the bracket and string state machine."""
        text, pos, depth, in_string = self.text, value.pos, value.depth, value.in_string
        begin = pos
        while pos < len(text):
            char = text[pos]
            if in_string:
                if char == "\\":
                    if pos + 1 >= len(text):
                        break  # the escaped character is not here yet
                    pos += 2
                    continue
                if char == '"':
                    in_string = False
                    if depth == 0:  # a string value: it closed
                        value.end = pos + 1
                        break
            elif char == '"':
                in_string = True
            elif char in "{[":
                depth += 1
            elif char in "}]":
                depth -= 1
                if depth == 0:
                    value.end = pos + 1
                    break
            pos += 1
        self.num_scanned += pos - begin
        value.pos, value.depth, value.in_string = pos, depth, in_string
