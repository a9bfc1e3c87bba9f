"""Turns finished sequences into `RequestOutput`s: detokenization, stop strings, and the
gathering of a request's `n` copies."""

from __future__ import annotations

from collections.abc import Iterable, KeysView
from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerBase

from tandem.engine.core.outputs import CompletionOutput, RequestOutput
from tandem.engine.core.request import Request, RequestStatus
from tandem.engine.detokenizer import IncrementalDetokenizer


@dataclass
class _Parent:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    num_children: int
    completions: dict[int, CompletionOutput] = field(default_factory=dict)
    num_cached_tokens: int = 0


class OutputProcessor:
    """Owns per-request output state. Sequences with stop strings are detokenized token by
    token (to stop as soon as one appears); the others once, when they finish."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase | None) -> None:
        self.tokenizer = tokenizer
        self._parents: dict[str, _Parent] = {}
        self._child_parent: dict[str, tuple[str, int]] = {}
        self._detoks: dict[str, IncrementalDetokenizer] = {}

    def add(self, parent_id: str, prompt: str | None, children: list[Request]) -> None:
        first = children[0]
        self._parents[parent_id] = _Parent(parent_id, prompt, first.prompt_token_ids, len(children))
        for index, child in enumerate(children):
            self._child_parent[child.request_id] = (parent_id, index)
            params = child.sampling_params
            if params.stop and self.tokenizer is not None:
                self._detoks[child.request_id] = IncrementalDetokenizer(
                    self.tokenizer,
                    child.prompt_token_ids,
                    params.skip_special_tokens,
                    params.stop,
                    params.include_stop_str_in_output,
                )

    def parent_ids(self) -> KeysView[str]:
        return self._parents.keys()

    def children_of(self, parent_id: str) -> list[str]:
        return [c for c, (p, _) in self._child_parent.items() if p == parent_id]

    def check_stop_strings(self, requests: Iterable[Request]) -> list[Request]:
        """Feed the token each request just sampled to its detokenizer, when it has stop
        strings; return the unfinished requests that hit one. A stop token is not text and
        is not fed. Sets `stop_reason` to the stop string found."""
        hits = []
        for request in requests:
            detok = self._detoks.get(request.request_id)
            if detok is None or request.ends_on_stop_token:
                continue
            if detok.update(request.output_token_ids[-1:]) is not None:
                request.stop_reason = detok.stopped_by
                if request.is_finished:
                    request.status = RequestStatus.FINISHED_STOPPED
                else:
                    hits.append(request)
        return hits

    def finish(self, request: Request) -> RequestOutput | None:
        """Record a finished sequence; return its parent's output once all copies are done."""
        parent_id, index = self._child_parent.pop(request.request_id)
        parent = self._parents[parent_id]
        parent.completions[index] = CompletionOutput(
            index=index,
            text=self._final_text(request),
            token_ids=list(request.output_token_ids),
            finish_reason=request.status.finish_reason,
            stop_reason=request.stop_reason,
            logprobs=list(request.output_logprobs)
            if request.sampling_params.logprobs is not None
            else None,
        )
        parent.num_cached_tokens = max(parent.num_cached_tokens, request.num_cached_tokens)
        if len(parent.completions) < parent.num_children:
            return None
        del self._parents[parent_id]
        return RequestOutput(
            request_id=parent_id,
            prompt=parent.prompt,
            prompt_token_ids=parent.prompt_token_ids,
            outputs=[parent.completions[i] for i in range(parent.num_children)],
            num_cached_tokens=parent.num_cached_tokens,
        )

    def _final_text(self, request: Request) -> str:
        detok = self._detoks.pop(request.request_id, None)
        if detok is not None:
            detok.flush()
            return detok.output_text
        if self.tokenizer is None:
            return ""
        ids = request.output_token_ids
        if request.ends_on_stop_token:
            ids = ids[:-1]
        return self.tokenizer.decode(
            ids, skip_special_tokens=request.sampling_params.skip_special_tokens
        )
