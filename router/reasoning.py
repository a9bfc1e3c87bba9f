"""Reasoning in a chat reply: what a model writes between `<think>` and `</think>`, split
from the answer and sent as `reasoning_content` (vLLM's field and behaviour).

- `qwen3` (Qwen3 with thinking on): the model writes both tags. A reply that does not
  open with `<think>` (after blanks) is all content.
- `deepseek_r1` (DeepSeek-R1, QwQ, Qwen3 Thinking-2507): the template opens `<think>` in
  the prompt, so the reply starts inside the reasoning, with no opening tag (one the model
  writes anyway is dropped); all of a reply cut off before `</think>` is reasoning.

The prompt has the first say (`for_prompt`): one that ends in a closed, empty block
(`enable_thinking: false` on Qwen3, `thinking: false` on DeepSeek-V3.1) has no reasoning
whatever the parser; one that ends in an open `<think>` starts inside it.

The content is everything after `</think>`, as written (vLLM does not strip it either).
`split(text, final)` is a pure function of the text so far whose parts only grow as the
text does: while the text grows, an ending that may be the start of a tag is held back.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

START, END = "<think>", "</think>"


@dataclass(frozen=True)
class Reasoned:
    reasoning: str | None  # None: the reply has no reasoning (so far)
    content: str


@dataclass(frozen=True)
class Spans:
    """Where a reply's parts lie in its text: the reasoning is `text[slice(*reasoning)]`
    (None: there is none), the content `text[content_start:]`."""

    reasoning: tuple[int, int] | None
    content_start: int
    ended: bool = False  # `</think>` was found (at `reasoning[1]`)


class ReasoningParser:
    name = ""
    starts_inside = False  # the prompt opened the reasoning

    def split(self, text: str, final: bool) -> Reasoned:
        """The reasoning and the content of the reply's whole text so far. Never raises."""
        spans = self.spans(text, final)
        reasoning = None if spans.reasoning is None else text[slice(*spans.reasoning)]
        return Reasoned(reasoning, text[spans.content_start :])

    def spans(self, text: str, final: bool, search_from: int = 0) -> Spans:
        """`split` as positions. `search_from`: no `</think>` starts before it (a stream
        searched its shorter text), so each piece costs the characters it adds."""
        blanks = _leading_blanks(text)
        head = text[blanks : blanks + len(START)]
        if not final and len(text) - blanks < len(START) and START.startswith(head):
            return Spans((0, 0) if self.starts_inside else None, len(text))  # a tag's start?
        if head == START:
            return _inside(text, blanks + len(START), final, search_from)
        if self.starts_inside:
            return _inside(text, 0, final, search_from)
        return Spans(None, 0)

    def for_prompt(self, prompt_tail: str) -> ReasoningParser | None:
        """The parser for a reply to a prompt that ends in `prompt_tail`: the prompt's
        own say first. None when it closed an empty block (thinking turned off, say
        `enable_thinking: false`); one that starts inside when it left `<think>` open."""
        tail = prompt_tail.rstrip()
        if tail.endswith(END):
            return None
        if tail.endswith(START) and not self.starts_inside:
            return DeepSeekR1Parser()
        return self


class Qwen3Parser(ReasoningParser):
    name = "qwen3"


class DeepSeekR1Parser(ReasoningParser):
    name = "deepseek_r1"
    starts_inside = True


PARSERS: dict[str, type[ReasoningParser]] = {p.name: p for p in (Qwen3Parser, DeepSeekR1Parser)}
REASONING_PARSER_CHOICES = ("auto", "none", *PARSERS)


def _inside(text: str, start: int, final: bool, search_from: int) -> Spans:
    """The reasoning from `start` to `</think>`, the content after it."""
    end = text.find(END, max(start, search_from))
    if end >= 0:
        return Spans((start, end), end + len(END), ended=True)
    stop = len(text) if final else _partial_start(text, END)
    return Spans((start, max(start, stop)), len(text))


def _partial_start(text: str, marker: str) -> int:
    """Where an ending of `text` that may be the start of `marker` begins (else its end)."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return len(text) - size
    return len(text)


def _leading_blanks(text: str) -> int:
    i = 0
    while i < len(text) and text[i].isspace():
        i += 1
    return i


@dataclass
class ReasoningStream:
    """What one streamed choice has sent of its reasoning and content (characters of
    each); `update` advances it, reading only what each piece adds."""

    parser: ReasoningParser
    reasoning_sent: int = 0
    content_sent: int = 0
    searched: int = 0  # no `</think>` starts before this

    def update(self, text: str, final: bool) -> tuple[str, str, int]:
        """(reasoning delta, content delta, where the content starts in `text`) for the
        choice's whole text so far."""
        spans = self.parser.spans(text, final, self.searched)
        if spans.ended:
            self.searched = spans.reasoning[1]  # found: the same place from now on
        else:
            self.searched = max(0, len(text) - len(END) + 1)
        delta = ""
        if spans.reasoning is not None:
            start, stop = spans.reasoning
            delta = text[start + self.reasoning_sent : stop]
            self.reasoning_sent = max(self.reasoning_sent, stop - start)
        content_delta = text[spans.content_start + self.content_sent :]
        self.content_sent += len(content_delta)
        return delta, content_delta, spans.content_start


def thinking_switch(tokenizer: PreTrainedTokenizerBase) -> str | None:
    """The chat template variable that turns thinking on and off: `enable_thinking`
    (Qwen3, and DeepSeek's templates that take it too), else `thinking` (DeepSeek-V3.1's
    own template); None when the template reads neither."""
    template = getattr(tokenizer, "chat_template", None)
    template = template if isinstance(template, str) else ""
    return next((name for name in ("enable_thinking", "thinking") if name in template), None)


def detect_reasoning_parser(tokenizer: PreTrainedTokenizerBase) -> str | None:
    """The parser a chat template calls for: none unless it mentions `<think>`;
    `deepseek_r1` when its generation prompt leaves a `<think>` open (the reply starts
    inside the reasoning), else `qwen3` (the model opens it)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if not isinstance(template, str) or START not in template:
        return None
    probe = "tandem-reasoning-probe"
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": probe}],
            add_generation_prompt=True,
            tokenize=False,
            enable_thinking=True,  # some templates close the block unless told to think
        )
    except Exception:  # a template that needs more than one user turn: the model opens it
        return Qwen3Parser.name
    tail = text[text.rfind(probe) + len(probe) :]
    opened = tail.rfind(START) > tail.rfind(END)
    return DeepSeekR1Parser.name if opened else Qwen3Parser.name


def reasoning_parser(name: str, tokenizer: PreTrainedTokenizerBase) -> ReasoningParser | None:
    """The `--reasoning-parser` flag's parser (`auto`: from the chat template). Raises
    ValueError for an unknown name."""
    if name not in REASONING_PARSER_CHOICES:
        raise ValueError(f"unknown reasoning parser {name!r}")
    found = detect_reasoning_parser(tokenizer) if name == "auto" else name
    return PARSERS[found]() if found in PARSERS else None
