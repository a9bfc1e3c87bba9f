"""The sampler's grammar step: forbidden tokens' logits set to -inf, for every sequence of
the batch that has a grammar, in one batched pass.

llguidance fills one bit per vocabulary entry for each constrained sequence, on its own
thread pool without the GIL. The bits become an additive mask (0 or -inf) by a lookup
table from each byte to its 8 entries, and the mask is added to the logits. Every buffer
is kept from step to step: on the CPU a fresh 40 MB tensor per step costs more in page
faults than the arithmetic (64 sequences of a 152k vocabulary: about 11 ms with reused
buffers, 60 ms without). Sequences without a grammar cost nothing; a batch without one
never reaches this class.
"""

from __future__ import annotations

from collections.abc import Sequence

import llguidance
import torch

from tandem.engine.core.request import Request
from tandem.engine.exec.logit_edits import host_tensor


def _byte_table(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[256, 8]: row b holds 0 where bit j of b is set (allowed), -inf elsewhere."""
    bits = (torch.arange(256)[:, None] >> torch.arange(8)) & 1
    return torch.where(bits.bool(), 0.0, float("-inf")).to(dtype=dtype, device=device)


class GrammarMask:
    """Owns the bitmask, index and mask buffers (grown to the largest batch seen) and
    llguidance's thread pool. `apply` edits the logits in place and reads the requests'
    matchers without advancing them."""

    def __init__(self, vocab_size: int, dtype: torch.dtype, device: torch.device) -> None:
        self.vocab_size = vocab_size  # the logits' width
        self.num_words = 0  # per row of llguidance's bitmask: its vocabulary's, once seen
        self.device = device
        self.executor = llguidance.LLExecutor()
        self._table = _byte_table(dtype, device)  # [256, 8]
        self._bitmask = torch.empty(0, 0, dtype=torch.int32)  # host [R, W]
        self._index = torch.empty(0, dtype=torch.int32, device=device)  # [R * 4W]
        self._additive = torch.empty(0, 8, dtype=dtype, device=device)  # [R * 4W, 8]

    def apply(self, logits: torch.Tensor, requests: Sequence[Request]) -> None:
        """`logits`: [S, V], row i for `requests[i]`; rows of requests with a grammar get
        -inf for every token their grammar forbids next."""
        rows = [i for i, r in enumerate(requests) if r.grammar is not None]
        if not rows:
            return
        assert logits.shape[1] == self.vocab_size, (logits.shape, self.vocab_size)
        # the grammars' vocabulary may be larger than the logits (a tokenizer's added token
        # with no logit): their masks are that wide, and cut to the logits below
        (grammar_vocab,) = {requests[i].grammar.vocab_size for i in rows}
        assert grammar_vocab >= self.vocab_size, (grammar_vocab, self.vocab_size)
        self._reserve(len(rows), (grammar_vocab + 31) // 32)
        bitmask = self._bitmask[: len(rows)]
        matchers = [(requests[i].grammar.matcher, k) for k, i in enumerate(rows)]
        self.executor.unsafe_compute_mask_ptr(
            matchers, bitmask.data_ptr(), self.num_words * 4, len(rows)
        )
        additive = self._additive_mask(bitmask)[:, : self.vocab_size]  # [R, V]
        if len(rows) == len(requests):
            logits.add_(additive)
        else:
            logits.index_add_(0, host_tensor(rows, torch.long, logits.device), additive)

    def _additive_mask(self, bitmask: torch.Tensor) -> torch.Tensor:
        """[R, W] int32 bits (bit j of word w: token 32w + j) -> [R, 32W] of 0 / -inf."""
        num_rows = bitmask.shape[0]
        num_bytes = num_rows * self.num_words * 4
        device_bits = bitmask.to(self.device, non_blocking=True)
        index = self._index[:num_bytes]
        # little-endian words: byte k holds tokens 8k .. 8k + 7, bit j token 8k + j
        index.copy_(device_bits.view(torch.uint8).view(-1))
        out = self._additive[:num_bytes]
        torch.index_select(self._table, 0, index, out=out)
        return out.view(num_rows, self.num_words * 32)

    def _reserve(self, num_rows: int, num_words: int) -> None:
        if num_rows <= self._bitmask.shape[0] and num_words == self.num_words:
            return
        self.num_words = num_words
        pin = self.device.type == "cuda"
        self._bitmask = torch.empty(num_rows, self.num_words, dtype=torch.int32, pin_memory=pin)
        num_bytes = num_rows * self.num_words * 4
        self._index = torch.empty(num_bytes, dtype=torch.int32, device=self.device)
        self._additive = torch.empty(num_bytes, 8, dtype=self._table.dtype, device=self.device)
