"""How a generation's answer is written out: the `Writer` interface `GenerationRunner`
drives (whole, or streamed record by record), and `ChunkWriter`, OpenAI's completion and
chat shapes. The Responses API has its own (`responses_stream.ResponsesWriter`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Protocol

from tandem.router.errors import APIError

if TYPE_CHECKING:
    from tandem.router.generation import Generation


class Writer(Protocol):
    """How one generation's answer is written, whole or streamed (made per generation; it
    may remember what it sent). Each streaming method returns the texts to send."""

    def whole(self) -> dict[str, Any]:
        """The body once every choice is done (non-streamed)."""

    def start(self) -> list[str]:
        """What the stream opens with, before the first record's."""

    def record(self, index: int, record: dict[str, Any]) -> list[str]:
        """What choice `index`'s record adds (its state already includes it)."""

    def done(self) -> list[str]:
        """The stream's end, every choice done."""

    def failed(self, error: APIError) -> list[str]:
        """The stream's end when a choice failed (or the router did)."""


class ChunkWriter:
    """OpenAI's completion and chat shapes: one object, or `data: {chunk}` per delta (with
    `include_usage`, a last chunk with the usage) and `data: [DONE]`."""

    def __init__(self, gen: Generation) -> None:
        self.gen = gen
        self.started = [False] * len(gen.states)

    def whole(self) -> dict[str, Any]:
        gen = self.gen
        body = gen.body([gen.fmt.choice(s) for s in gen.states], chunk=False)
        body["usage"] = gen.usage
        return body

    def start(self) -> list[str]:
        return []

    def record(self, index: int, record: dict[str, Any]) -> list[str]:
        gen, texts = self.gen, []
        for choice in gen.fmt.deltas(gen.states[index], record, not self.started[index]):
            chunk = gen.body([choice], chunk=True)
            if gen.include_usage:
                chunk["usage"] = None
            texts.append(_data(chunk))
        self.started[index] = True
        return texts

    def done(self) -> list[str]:
        gen = self.gen
        usage_chunk = [_data({**gen.body([], chunk=True), "usage": gen.usage})]
        return [*(usage_chunk if gen.include_usage else []), _DONE]

    def failed(self, error: APIError) -> list[str]:
        return [_data({"error": json.loads(error.response().body)["error"]}), _DONE]


_DONE = "data: [DONE]\n\n"


def _data(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"
