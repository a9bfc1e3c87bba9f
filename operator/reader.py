"""Typed, path-aware reads from a custom resource's plain dicts. Every refusal is a
ValueError whose message starts with the field's path (`spec.prefill.replicas: ...`)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

_MISSING = object()


class Reader:
    """A view of one object at `path`; reading never mutates the object."""

    def __init__(self, data: dict[str, Any], path: str, present: bool = True) -> None:
        self.data = data
        self.path = path
        self.present = present

    def error(self, message: str, key: str | None = None) -> ValueError:
        return ValueError(f"{self._at(key)}: {message}")

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def child(self, key: str, *, required: bool = False) -> Reader:
        value = self._value(key, {} if not required else _MISSING)
        if not isinstance(value, dict):
            raise self.error(f"must be an object, got {type(value).__name__}", key)
        return Reader(value, self._at(key), present=self.has(key))

    def string(
        self,
        key: str,
        *,
        default: Any = None,
        required: bool = False,
        choices: Sequence[str] = (),
        min_length: int = 0,
        pattern: str | None = None,
    ) -> str:
        value = self._value(key, _MISSING if required else default)
        if value is None:
            return value
        if not isinstance(value, str):
            raise self.error(f"must be a string, got {value!r}", key)
        if choices and value not in choices:
            raise self.error(f"must be one of {', '.join(choices)}, got {value!r}", key)
        if len(value) < min_length:
            raise self.error("must not be empty", key)
        if pattern is not None and not re.fullmatch(pattern, value):
            raise self.error(f"must match {pattern}, got {value!r}", key)
        return value

    def integer(
        self,
        key: str,
        *,
        default: Any = None,
        required: bool = False,
        minimum: int | None = None,
        maximum: int | None = None,
        choices: Sequence[int] = (),
    ) -> int:
        value = self._value(key, _MISSING if required else default)
        if value is None:
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(f"must be an integer, got {value!r}", key)
        if choices and value not in choices:
            raise self.error(f"must be one of {', '.join(map(str, choices))}, got {value}", key)
        self._check_range(key, value, minimum, maximum)
        return value

    def number(
        self,
        key: str,
        *,
        default: Any = None,
        required: bool = False,
        above: float | None = None,
        maximum: float | None = None,
    ) -> float:
        value = self._value(key, _MISSING if required else default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(f"must be a number, got {value!r}", key)
        if above is not None and value <= above:
            raise self.error(f"must be greater than {above}, got {value}", key)
        self._check_range(key, value, None, maximum)
        return float(value)

    def boolean(self, key: str, *, default: bool) -> bool:
        value = self._value(key, default)
        if not isinstance(value, bool):
            raise self.error(f"must be true or false, got {value!r}", key)
        return value

    def mapping(self, key: str) -> dict[str, Any]:
        value = self._value(key, {})
        if not isinstance(value, dict):
            raise self.error(f"must be an object, got {type(value).__name__}", key)
        return value

    def sequence(self, key: str) -> list[Any]:
        value = self._value(key, [])
        if not isinstance(value, list):
            raise self.error(f"must be a list, got {type(value).__name__}", key)
        return value

    def _value(self, key: str, default: Any) -> Any:
        value = self.data.get(key)
        if value is not None:
            return value
        if default is _MISSING:
            raise self.error("is required", key)
        return default

    def _check_range(self, key: str, value: float, minimum: float | None, maximum: float | None):
        if minimum is not None and value < minimum:
            raise self.error(f"must be at least {minimum}, got {value}", key)
        if maximum is not None and value > maximum:
            raise self.error(f"must be at most {maximum}, got {value}", key)

    def _at(self, key: str | None) -> str:
        if key is None:
            return self.path or "<root>"
        return f"{self.path}.{key}" if self.path else key
