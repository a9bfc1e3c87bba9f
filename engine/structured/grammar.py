"""Structured outputs compiled for one tokenizer, with llguidance.

`GrammarCompiler` turns a `StructuredOutputsParams` into a `Grammar`, the per-request
matcher that knows which tokens may come next. Compiling is cached by the spec's key
(`StructuredOutputsParams.key`): a cached grammar is a matcher at its start state, and
each request gets a copy of it (microseconds, where compiling takes a millisecond or more).

Why llguidance and not xgrammar: it refuses what it cannot enforce (`not`, `if`/`then`,
`uniqueItems`, unknown formats, remote `$ref`s), where xgrammar ignores such keywords and
lets output through that the schema rejects; and it compiles lazily, in about a
millisecond for the schemas we tried where xgrammar takes 25 to 440 ms (the numbers are in
docs/performance.md).
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence

import llguidance
import llguidance.hf
from llguidance.gbnf_to_lark import any_to_lark
from transformers import PreTrainedTokenizerBase

from tandem.engine.structured.spec import StructuredOutputsParams

logger = logging.getLogger(__name__)

# JSON as OpenAI's structured outputs write it: no whitespace between tokens, so a model
# cannot pad its output with blanks until max_tokens runs out.
_JSON_OPTIONS = {"whitespace_flexible": False}
_MAX_ERROR_CHARS = 400


class InvalidGrammar(ValueError):
    """The spec cannot be compiled: a schema that is not one, a feature llguidance cannot
    enforce, a regex or grammar that does not parse."""


class Grammar:
    """One sequence's place in its grammar. Owned by its request: `accept` advances it with
    each appended token; the sampler reads `matcher` to mask the next token's logits."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size  # bits in the matcher's masks (>= the model's logits)

    def accept(self, token_id: int) -> bool:
        """Advance past `token_id`; False if the grammar forbids it (the grammar is then in
        error and stays there)."""
        return self.matcher.consume_token(token_id)

    @property
    def is_terminated(self) -> bool:
        """No token can follow (the grammar is complete, or in error)."""
        return self.matcher.is_stopped()

    @property
    def is_error(self) -> bool:
        return self.matcher.is_error()

    @property
    def error(self) -> str:
        return self.matcher.get_error()[:_MAX_ERROR_CHARS]


class GrammarCompiler:
    """Compiles specs for one tokenizer and caches the results (least recently used out
    past `max_entries`). Thread-safe: the router validates specs on several threads (its
    CPU pool); a spec two threads miss at once is compiled by both, and one result kept.
    The llguidance tokenizer is built on first use (about two seconds for a 150k
    vocabulary), so an offline engine that never sees a grammar never pays for it; servers
    build it at start-up (`prepare`).

    Its vocabulary is the larger of the model's (`vocab_size`, the logits' width) and the
    tokenizer's, as vLLM does: llguidance refuses fewer entries than the tokenizer has
    tokens, and a tokenizer may count an added token the model has no logit for (a model
    served before structured outputs existed must still start). Tokens past the logits are
    never sampled (the mask is cut to the logits' width). A tokenizer llguidance cannot take
    at all leaves structured outputs unavailable: `prepare` logs it and returns, and every
    spec raises InvalidGrammar saying why (a 400), while plain requests are served."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase | None,
        vocab_size: int,
        eos_token_ids: Sequence[int],
        max_entries: int = 256,
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self.max_entries = max_entries
        self._ll_tokenizer: llguidance.LLTokenizer | None = None
        self.unavailable: str | None = None  # why structured outputs cannot be served
        self._cache: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()  # the cache's order; compiling runs outside it

    def prepare(self) -> None:
        """Build the llguidance tokenizer now rather than on the first spec: a server calls
        this at start-up, so no request waits a second for it. Never raises: a tokenizer
        llguidance refuses is logged and leaves structured outputs unavailable."""
        try:
            self._tokenizer()
        except InvalidGrammar as exc:
            logger.warning("%s; plain requests are served", exc)

    def matcher(self, spec: StructuredOutputsParams) -> Grammar:
        """A fresh matcher at the grammar's start. Raises InvalidGrammar."""
        matcher = self._compiled(spec).deep_copy()
        return Grammar(matcher, self._tokenizer().vocab_size)

    def validate(self, spec: StructuredOutputsParams) -> None:
        """Compile (or find cached) and discard. Raises InvalidGrammar."""
        self._compiled(spec)

    @property
    def num_cached(self) -> int:
        return len(self._cache)

    def _compiled(self, spec: StructuredOutputsParams) -> llguidance.LLMatcher:
        key = spec.key()
        with self._lock:
            found = self._cache.get(key)
            if found is not None:
                self._cache.move_to_end(key)
                return found
        matcher = llguidance.LLMatcher(self._tokenizer(), grammar_text(spec), log_level=0)
        if matcher.is_error():
            raise InvalidGrammar(_first_error(matcher.get_error()))
        with self._lock:
            self._cache[key] = matcher
            if len(self._cache) > self.max_entries:
                self._cache.popitem(last=False)
        return matcher

    def _tokenizer(self) -> llguidance.LLTokenizer:
        if self._ll_tokenizer is not None:
            return self._ll_tokenizer
        if self.unavailable is None and self.tokenizer is None:
            self.unavailable = "structured outputs need the model's tokenizer"
        if self.unavailable is None:
            n_vocab = max(self.vocab_size, len(self.tokenizer))
            try:
                self._ll_tokenizer = llguidance.hf.from_tokenizer(
                    self.tokenizer, n_vocab=n_vocab, eos_token=self.eos_token_ids or None
                )
                return self._ll_tokenizer
            except (ValueError, TypeError, RuntimeError) as exc:  # llguidance's refusals
                self.unavailable = (
                    f"structured outputs are not available for this model: {_first_error(str(exc))}"
                )
        raise InvalidGrammar(self.unavailable)


def grammar_text(spec: StructuredOutputsParams) -> str:
    """The spec in llguidance's grammar format (not yet checked). Raises InvalidGrammar
    for a schema llguidance cannot even read."""
    kind = spec.kind
    try:
        if kind == "json":
            schema = spec.json if isinstance(spec.json, dict) else {}
            if spec.json is False:
                raise InvalidGrammar("the JSON schema false admits nothing")
            return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_OPTIONS)
        if kind == "json_object":
            return llguidance.LLMatcher.grammar_from_json_schema(
                {"type": "object"}, defaults=_JSON_OPTIONS
            )
        if kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(spec.regex)
        if kind == "choice":
            # JSON string literals are Lark string literals (llguidance reads their escapes).
            return llguidance.LLMatcher.grammar_from_lark(
                "start: " + " | ".join(json.dumps(c) for c in spec.choice)
            )
        return llguidance.LLMatcher.grammar_from_lark(any_to_lark(spec.grammar))
    except InvalidGrammar:
        raise
    except Exception as exc:  # llguidance raises plain exceptions for unreadable input
        raise InvalidGrammar(_first_error(str(exc))) from exc


def _first_error(message: str) -> str:
    """llguidance's message without the parser-state dump it may append."""
    return message.split("\n<state>")[0].strip()[:_MAX_ERROR_CHARS]
