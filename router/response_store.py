"""The Responses API's store: the responses created with `store` (OpenAI's default), kept
so that `GET /v1/responses/{id}` returns one and `previous_response_id` continues from it.

Bounded, least recently used first out, in this router replica's memory only: a restart
loses it, and another replica does not see it (a client behind several replicas needs
sticky routing, or sends the whole conversation as `input`).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

DEFAULT_SIZE = 1000


@dataclass(frozen=True)
class StoredResponse:
    """A response as sent (`body`), and the conversation it ends: its input items (those
    of the responses it continued first; never `instructions`, which OpenAI does not
    carry over) then its output items, as input items to continue from."""

    body: dict[str, Any]
    items: list[dict[str, Any]]


class ResponseStore:
    """At most `size` responses; `get` counts as a use. Not thread-safe: used on the
    router's event loop only."""

    def __init__(self, size: int = DEFAULT_SIZE) -> None:
        if size < 0:
            raise ValueError(f"--responses-store-size must be at least 0, not {size}")
        self.size = size
        self._responses: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._responses)

    def put(self, response: StoredResponse) -> None:
        """Keep `response` (by its body's `id`), forgetting the least recently used one
        when full. A store of size 0 keeps nothing."""
        if self.size == 0:
            return
        key = response.body["id"]
        self._responses[key] = response
        self._responses.move_to_end(key)
        while len(self._responses) > self.size:
            self._responses.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        found = self._responses.get(response_id)
        if found is not None:
            self._responses.move_to_end(response_id)
        return found

    def delete(self, response_id: str) -> bool:
        """Forget the response; False when it was not kept."""
        return self._responses.pop(response_id, None) is not None
