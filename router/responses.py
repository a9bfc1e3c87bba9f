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
from tandem.router.reasoning import ReasoningParser, ReasoningStream
from tandem.router.tool_parsers import ToolParser
from tandem.router.tool_stream import ToolCallStream, visible_content


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
    cached_tokens: int = 0  # prompt tokens the decode node found in a prefix cache
    text_offset: int = 0  # completions: where the next token's text starts
    tool_stream: ToolCallStream | None = None  # chat with tools, streamed: what was sent
    reasoning_stream: ReasoningStream | None = None  # chat with reasoning, streamed

    def add(self, record: dict[str, Any]) -> None:
        self.text += record["text"]
        self.token_ids += record["token_ids"]
        self.logprobs += record["logprobs"] or []
        if record["finish_reason"] is not None:
            self.finish_reason = record["finish_reason"]
            self.stop_reason = record.get("stop_reason")
            self.completion_tokens = record["usage"]["completion_tokens"]
            self.cached_tokens = record["usage"].get("cached_tokens", 0)


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
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

    def deltas(
        self, state: ChoiceState, record: dict[str, Any], first: bool
    ) -> list[dict[str, Any]]:
        """The part of a streamed choice that `record` adds (`state` already includes it),
        as one chunk's choice."""
        prefix = state.prefix if first else ""
        start = state.text_offset + len(prefix)
        return [
            {
                "index": state.index,
                "text": prefix + record["text"],
                "logprobs": self._logprobs(state, record["logprobs"] or [], start),
                "finish_reason": record["finish_reason"],
                "stop_reason": record.get("stop_reason"),
            }
        ]

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
    """Chat choices; with a reasoning parser the text up to `</think>` becomes
    `reasoning_content` and only the rest is parsed for calls. With a tool parser (the
    request has tools, `tool_choice` not "none") the reply's calls become
    `message.tool_calls` (or tool-call deltas) and a reply that stopped with calls has
    `finish_reason` "tool_calls"."""

    object = "chat.completion"
    chunk_object = "chat.completion.chunk"

    def __init__(
        self,
        pre: Preprocessor,
        want_logprobs: bool,
        parser: ToolParser | None = None,
        reasoning: ReasoningParser | None = None,
    ) -> None:
        self.pre = pre
        self.want_logprobs = want_logprobs
        self.parser = parser
        self.reasoning = reasoning

    def choice(self, state: ChoiceState) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": state.text}
        text = state.text
        if self.reasoning is not None:
            split = self.reasoning.split(text, final=True)
            message["reasoning_content"] = split.reasoning
            text = split.content
            # vLLM's: a reply that reasoned and said nothing after has no content
            message["content"] = (text or None) if split.reasoning is not None else text
        finish = state.finish_reason
        if self.parser is not None:
            parsed = self.parser.parse(text, final=True)
            calls = ToolCallStream(self.parser).message_calls(parsed)
            content = visible_content(parsed, final=True)
            message["content"] = (content or None) if calls else content
            if calls:
                message["tool_calls"] = calls
                finish = _with_calls(finish)
        return {
            "index": state.index,
            "message": message,
            "logprobs": self._logprobs(state.logprobs),
            "finish_reason": finish,
            "stop_reason": state.stop_reason,
        }

    def deltas(
        self, state: ChoiceState, record: dict[str, Any], first: bool
    ) -> list[dict[str, Any]]:
        """The chunks' choices for what `record` adds (`state` already includes it): one,
        or with tools one per piece (content, then each call's first delta and argument
        fragments); the record's logprobs go on the first, its finish on the last.
        Reasoning comes first, as `reasoning_content`."""
        final = record["finish_reason"] is not None
        reasoning, content, content_delta = self._split(state, record, final)
        if self.parser is None:
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if reasoning:
                delta["reasoning_content"] = reasoning
            if content_delta or first:
                delta["content"] = content_delta
            pieces, finish = [delta], record["finish_reason"]
        else:
            pieces, made_calls = self._tool_pieces(state, content, reasoning, final, first)
            finish = record["finish_reason"]
            finish = _with_calls(finish) if made_calls else finish
        holds = self.parser is not None or self.reasoning is not None
        if holds and pieces == [{}] and finish is None and not self.want_logprobs:
            return []  # text held back (a call's start, a tag's): nothing to show yet
        return [
            {
                "index": state.index,
                "delta": delta,
                "logprobs": self._logprobs(record["logprobs"] or []) if i == 0 else None,
                "finish_reason": finish if i == len(pieces) - 1 else None,
                "stop_reason": record.get("stop_reason") if i == len(pieces) - 1 else None,
            }
            for i, delta in enumerate(pieces)
        ]

    def _split(
        self, state: ChoiceState, record: dict[str, Any], final: bool
    ) -> tuple[str, str, str]:
        """(reasoning delta, the whole content so far, content delta)."""
        if self.reasoning is None:
            return "", state.text, record["text"]
        if state.reasoning_stream is None:
            state.reasoning_stream = ReasoningStream(self.reasoning)
        delta, content_delta, content_start = state.reasoning_stream.update(state.text, final)
        content = state.text[content_start:] if self.parser is not None else ""
        return delta, content, content_delta

    def _tool_pieces(
        self, state: ChoiceState, content: str, reasoning: str, final: bool, first: bool
    ) -> tuple[list[dict[str, Any]], bool]:
        """The pieces, and whether the reply made calls."""
        if state.tool_stream is None:
            state.tool_stream = ToolCallStream(self.parser)
        content_delta, entries = state.tool_stream.update(content, final)
        head: dict[str, Any] = {"role": "assistant"} if first else {}
        if reasoning:
            head["reasoning_content"] = reasoning
        if content_delta:
            head["content"] = content_delta
        pieces = [head] if head or not entries else []
        pieces += [{"tool_calls": [entry]} for entry in entries]
        return pieces, bool(state.tool_stream.call_ids)

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


def _with_calls(finish_reason: str | None) -> str | None:
    """A reply that ended by itself and made calls ends for them (a cut one stays cut)."""
    return "tool_calls" if finish_reason == "stop" else finish_reason


Format = CompletionFormat | ChatFormat
