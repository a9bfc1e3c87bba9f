"""What a request's output must look like: a JSON schema, any JSON object, a regex, one of
a few strings, or a grammar. Plain data (it travels in the sampling dictionary from the
router to the decode node and on to the prefill node); each node compiles it itself
(`tandem.engine.structured.grammar`), so nothing compiled ever crosses a process boundary.

The names are vLLM's `StructuredOutputsParams`: exactly one of `json`, `json_object`,
`regex`, `choice` and `grammar` is set. `grammar` is llguidance's Lark dialect (a GBNF
grammar, recognised by its `::=`, is converted).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

KINDS = ("json", "json_object", "regex", "choice", "grammar")


@dataclass(frozen=True)
class StructuredOutputsParams:
    """Raises ValueError unless exactly one kind is set, with a value of its type."""

    json: dict[str, Any] | str | None = None
    json_object: bool | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        chosen = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(chosen) != 1:
            raise ValueError(
                f"structured outputs need exactly one of {', '.join(KINDS)}; got "
                f"{', '.join(chosen) or 'none'}"
            )
        if isinstance(self.json, str):
            try:
                object.__setattr__(self, "json", json.loads(self.json))
            except ValueError as exc:
                raise ValueError(f"the JSON schema is not JSON: {exc}") from exc
        checks = {
            "json": isinstance(self.json, dict | bool),
            "json_object": self.json_object is True,
            "regex": isinstance(self.regex, str),
            "choice": isinstance(self.choice, list)
            and bool(self.choice)
            and all(isinstance(c, str) for c in self.choice),
            "grammar": isinstance(self.grammar, str) and bool(self.grammar.strip()),
        }
        if not checks[chosen[0]]:
            raise ValueError(f"structured outputs: {chosen[0]} has the wrong type or is empty")

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    @property
    def value(self) -> Any:
        return getattr(self, self.kind)

    def key(self) -> str:
        """A stable key of the spec (SHA-256 of its canonical JSON): equal specs, whatever
        their key order, share one compiled grammar."""
        canonical = json.dumps([self.kind, self.value], sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    @classmethod
    def coerce(cls, value: StructuredOutputsParams | dict[str, Any] | None) -> Any:
        """From the dictionary form it travels in (or None, or an instance)."""
        if value is None or isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise ValueError("structured_outputs must be an object")
        unknown = set(value) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown structured_outputs field(s): {', '.join(sorted(unknown))}")
        return cls(**value)
