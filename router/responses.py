"""OpenAI's response shapes, built from the decode workers' records.

A record carries `token_ids`, a `text` delta, `logprobs` (per token: the chosen token's
logprob, rank and the top alternatives as [token id, logprob] pairs) and, on the last one,
`finish_reason`, `stop_reason` and `usage`. `CompletionFormat` and `ChatFormat` turn those
into `text_completion` objects and chunks, and `chat.completion` objects and chunks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tandem.router.preprocess import Preprocessor


@dataclass
class ChoiceState:
    """What one choice has produced so far."""

    index: int
    prefix: str = ""  # echoed prompt text (completions)
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    completion_tokens: int = 0
    text_offset: int = 0  # completions: where the next token's text starts

    def add(self, record: dict[str, Any]) -> None:
        self.text += record["text"]
        self.token_ids += record["token_ids"]
        self.logprobs += record["logprobs"] or []
        if record["finish_reason"] is not None:
            self.finish_reason = record["finish_reason"]
            self.stop_reason = record.get("stop_reason")
            self.completion_tokens = record["usage"]["completion_tokens"]


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class CompletionFormat:
    object = "text_completion"
    chunk_object = "text_completion"

    def __init__(self, pre: Preprocessor, want_logprobs: bool) -> None:
        self.pre = pre
        self.want_logprobs = want_logprobs

    def choice(self, state: ChoiceState) -> dict[str, Any]:
        """The whole choice (non-streaming)."""
        return {
            "index": state.index,
            "text": state.prefix + state.text,
            "logprobs": self._logprobs(state, state.logprobs, len(state.prefix)),
            "finish_reason": state.finish_reason,
            "stop_reason": state.stop_reason,
        }

    def delta(self, state: ChoiceState, record: dict[str, Any], first: bool) -> dict[str, Any]:
        """The part of a streamed choice that `record` adds (`state` already includes it)."""
        prefix = state.prefix if first else ""
        start = state.text_offset + len(prefix)
        return {
            "index": state.index,
            "text": prefix + record["text"],
            "logprobs": self._logprobs(state, record["logprobs"] or [], start),
            "finish_reason": record["finish_reason"],
            "stop_reason": record.get("stop_reason"),
        }

    def _logprobs(
        self, state: ChoiceState, entries: list[dict[str, Any]], start: int
    ) -> dict[str, Any] | None:
        if not self.want_logprobs:
            return None
        tokens, offsets, offset = [], [], start
        for e in entries:
            text = self.pre.token_text(e["token_id"])
            tokens.append(text)
            offsets.append(offset)
            offset += len(text)
        state.text_offset = offset
        return {
            "tokens": tokens,
            "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [self._top(e["top"]) for e in entries],
            "text_offset": offsets,
        }

    def _top(self, top: list[list]) -> dict[str, float] | None:
        """Best first; tokens that print alike (say two partial UTF-8 bytes, both "\ufffd")
        keep the best value, as the dict can hold one."""
        out: dict[str, float] = {}
        for token_id, logprob in top:
            out.setdefault(self.pre.token_text(token_id), logprob)
        return out or None


class ChatFormat:
    object = "chat.completion"
    chunk_object = "chat.completion.chunk"

    def __init__(self, pre: Preprocessor, want_logprobs: bool) -> None:
        self.pre = pre
        self.want_logprobs = want_logprobs

    def choice(self, state: ChoiceState) -> dict[str, Any]:
        return {
            "index": state.index,
            "message": {"role": "assistant", "content": state.text},
            "logprobs": self._logprobs(state.logprobs),
            "finish_reason": state.finish_reason,
            "stop_reason": state.stop_reason,
        }

    def delta(self, state: ChoiceState, record: dict[str, Any], first: bool) -> dict[str, Any]:
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if record["text"] or first:
            delta["content"] = record["text"]
        return {
            "index": state.index,
            "delta": delta,
            "logprobs": self._logprobs(record["logprobs"] or []),
            "finish_reason": record["finish_reason"],
            "stop_reason": record.get("stop_reason"),
        }

    def _logprobs(self, entries: list[dict[str, Any]]) -> dict[str, Any] | None:
        if not self.want_logprobs:
            return None
        return {"content": [self._entry(e) for e in entries]}

    def _entry(self, e: dict[str, Any]) -> dict[str, Any]:
        item = self._token(e["token_id"], e["logprob"])
        item["top_logprobs"] = [self._token(t, v) for t, v in e["top"]]
        return item

    def _token(self, token_id: int, logprob: float) -> dict[str, Any]:
        text = self.pre.token_text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}


Format = CompletionFormat | ChatFormat
