"""One tool-call object in a model's reply, whole or still being written: its name and the
raw text of its arguments.

Model output is untrusted: nothing here raises on it. The rule for malformed output: a
call object whose name is not a JSON string (a raw newline or a bad escape such as `\\q`
in it, or an escaped lone surrogate, which UTF-8 cannot carry), or an object that is
complete but not a call, is not a call; each format's parser then treats it as it treats
any text that is not a call (dropped between calls, or the reply's content). Arguments are
passed on as written, valid JSON or not: clients validate them, as OpenAI's documentation
advises.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tandem.router.json_scan import TextScan

_NAME_KEY = '"name"'


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # the arguments' JSON text as written (a prefix while it is written)


def parse_call(scan: TextScan, start: int, end: int | None, key: str) -> ParsedCall | None:
    """The call object at `scan.text[start]` (a `{`), closed at `end` (None: still being
    written): None until its name is known (at once when `"name"` is its first key, else
    once the object is complete and parses). The arguments are the raw text of its `key`
    value, as far as written. Looks only at text it has not seen, but for the closed name
    and, once, a complete object."""
    if end is not None:  # closed: the same answer from now on
        if ("call", start) not in scan.memo:
            scan.memo["call", start] = _open_or_closed(scan, start, end, key)
        return scan.memo["call", start]
    return _open_or_closed(scan, start, end, key)


def _open_or_closed(scan: TextScan, start: int, end: int | None, key: str) -> ParsedCall | None:
    named = _name_first(scan, start)
    if named is not None:
        name, name_end = named
        if name is None:
            return None  # a name that is not a JSON string: not a call
        return ParsedCall(name, _raw_value(scan, name_end, end, key))
    if end is None:
        return None
    return _whole(scan.text[start:end], key)


def _name_first(scan: TextScan, start: int) -> tuple[str | None, int] | None:
    """(name, index past it) when the object's first key is `"name"` and its string value
    is closed (the name None when that string is not valid JSON); else None."""
    text = scan.text
    pos = scan.skip_whitespace(start + 1)
    if not text.startswith(_NAME_KEY, pos):
        return None
    pos = scan.skip_whitespace(pos + len(_NAME_KEY))
    if not text.startswith(":", pos):
        return None
    pos = scan.skip_whitespace(pos + 1)
    if not text.startswith('"', pos):
        return None
    name_end = scan.value_end(pos)
    if name_end is None:
        return None
    if ("name", pos) not in scan.memo:
        scan.memo["name", pos] = _json_string(text[pos:name_end])
    return scan.memo["name", pos], name_end


def _json_string(literal: str) -> str | None:
    try:
        value = json.loads(literal)
    except ValueError:
        return None
    return value if _is_name(value) else None


def _is_name(value: object) -> bool:
    """A string that can be sent as UTF-8 (a lone surrogate, as `\\ud800` decodes to,
    cannot)."""
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _whole(obj: str, key: str) -> ParsedCall | None:
    try:
        loaded = json.loads(obj)
    except ValueError:
        return None
    if not isinstance(loaded, dict) or not _is_name(loaded.get("name")):
        return None
    arguments = json.dumps(loaded.get(key, {}), ensure_ascii=False)
    if not _is_name(arguments):  # an escaped lone surrogate: keep it escaped
        arguments = json.dumps(loaded.get(key, {}))
    return ParsedCall(loaded["name"], arguments)


def _raw_value(scan: TextScan, pos: int, end: int | None, key: str) -> str:
    """The raw text of `"key": value` after `pos` inside the object that ends at `end`."""
    complete = end is not None
    limit = end if end is not None else len(scan.text)
    quoted = json.dumps(key)
    at = scan.find(quoted, pos)
    while 0 <= at < limit:
        colon = scan.skip_whitespace(at + len(quoted))
        if scan.text.startswith(":", colon) and colon < limit:
            start = scan.skip_whitespace(colon + 1)
            if start < limit:
                value_end = scan.value_end(start, final=complete)
                stop = limit if value_end is None else min(value_end, limit)
                return scan.text[start:stop]
            break
        if colon >= len(scan.text):
            break  # the colon may still come
        at = scan.find(quoted, at + 1)
    return "{}" if complete else ""
