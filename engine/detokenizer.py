"""Incremental detokenization with stop strings.

Text is produced from a sliding window of token ids, so a character split across several
byte-level tokens appears once all of its bytes have arrived, never as U+FFFD in between.
With stop strings, the last `max(len(stop)) - 1` characters are held back until they can
no longer begin a stop string, so a stop string is never streamed, even across tokens.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from transformers import PreTrainedTokenizerBase

# Prompt tokens kept as left context: some tokenizers render a token differently at the
# start of a string (leading spaces).
_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    """Turns a growing list of output token ids into text deltas.

    `update` consumes new ids and returns the stop string it found, if any; `output_text`
    is the text so far (cut before the stop string); `take_delta` returns what may be
    streamed now.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompt_token_ids: Sequence[int],
        skip_special_tokens: bool = True,
        stop: Sequence[str] = (),
        include_stop_str_in_output: bool = False,
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.stop = tuple(stop)
        self.include_stop = include_stop_str_in_output
        self._holdback = max((len(s) for s in self.stop), default=1) - 1
        self._ids = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self.output_text = ""
        self._num_emitted = 0
        self.stopped_by: str | None = None

    def update(self, new_token_ids: Iterable[int]) -> str | None:
        """Append ids; return the stop string if one now appears (text is cut there)."""
        if self.stopped_by is not None:
            return self.stopped_by
        for token_id in new_token_ids:
            self._ids.append(token_id)
            checked_from = len(self.output_text)
            self.output_text += self._decode_next()
            if self.stop and self._find_stop(checked_from):
                return self.stopped_by
        return None

    def flush(self) -> None:
        """At the end of the sequence: emit bytes still waiting for completion as they are."""
        if self.stopped_by is None and self._read_offset < len(self._ids):
            tail = self._decode(self._ids[self._prefix_offset :])
            head = self._decode(self._ids[self._prefix_offset : self._read_offset])
            self.output_text += tail[len(head) :]
            self._read_offset = len(self._ids)

    def take_delta(self, finished: bool) -> str:
        """Text not yet taken that can no longer turn into a stop string."""
        end = len(self.output_text)
        if not finished and self.stopped_by is None:
            end = max(self._num_emitted, end - self._holdback)
        delta = self.output_text[self._num_emitted : end]
        self._num_emitted = end
        return delta

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def _decode_next(self) -> str:
        prefix = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full = self._decode(self._ids[self._prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
            return full[len(prefix) :]
        return ""

    def _find_stop(self, checked_from: int) -> bool:
        start = max(0, checked_from - self._holdback)
        found = [(i, s) for s in self.stop if (i := self.output_text.find(s, start)) != -1]
        if not found:
            return False
        idx, stop = min(found)
        self.output_text = self.output_text[: idx + len(stop) if self.include_stop else idx]
        self.stopped_by = stop
        return True
