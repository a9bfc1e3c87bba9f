"""The sampler's grammar step: forbidden tokens' logits set to -inf, for every sequence of
the batch that has a grammar, in one batched pass.

The bits come filled in the step's plan (one bit per vocabulary entry for each constrained
sequence, `tandem.engine.structured.bitmask`, on the scheduler's side where the matchers
live). They become an additive mask (0 or -inf) by a lookup table from each byte to its 8
entries, and the mask is added to the logits. Every device buffer is kept from step to
step: on the CPU a fresh 40 MB tensor per step costs more in page faults than the
arithmetic (64 sequences of a 152k vocabulary: about 11 ms with reused buffers, 60 ms
without). Sequences without a grammar cost nothing; a batch without one never reaches this
class.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from tandem.engine.exec.logit_edits import host_tensor


def _byte_table(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[256, 8]: row b holds 0 where bit j of b is set (allowed), -inf elsewhere."""
    bits = (torch.arange(256)[:, None] >> torch.arange(8)) & 1
    return torch.where(bits.bool(), 0.0, float("-inf")).to(dtype=dtype, device=device)


class GrammarMask:
    """Owns the index and mask buffers (grown to the largest batch seen). `apply` edits the
    logits in place."""

    def __init__(self, vocab_size: int, dtype: torch.dtype, device: torch.device) -> None:
        self.vocab_size = vocab_size  # the logits' width
        self.num_words = 0  # per row of the bitmask: the grammars' vocabulary's, once seen
        self.device = device
        self._table = _byte_table(dtype, device)  # [256, 8]
        self._num_rows = 0
        self._index = torch.empty(0, dtype=torch.int32, device=device)  # [R * 4W]
        self._additive = torch.empty(0, 8, dtype=dtype, device=device)  # [R * 4W, 8]

    def apply(self, logits: torch.Tensor, rows: Sequence[int], bits: np.ndarray) -> None:
        """`logits`: [S, V]; `bits`: [G, W] int32, row g the allowed tokens of logits row
        `rows[g]` (bit j of word w: token 32w + j). Those rows get -inf for every token
        their grammar forbids next."""
        if not rows:
            return
        assert bits.dtype == np.int32 and bits.shape[0] == len(rows), (bits.shape, len(rows))
        assert logits.shape[1] == self.vocab_size, (logits.shape, self.vocab_size)
        # the grammars' vocabulary may be larger than the logits (a tokenizer's added token
        # with no logit): their masks are that wide, and cut to the logits below
        assert bits.shape[1] * 32 >= self.vocab_size, (bits.shape, self.vocab_size)
        self._reserve(len(rows), bits.shape[1])
        additive = self._additive_mask(bits)[:, : self.vocab_size]  # [G, V]
        if len(rows) == logits.shape[0]:
            logits.add_(additive)
        else:
            logits.index_add_(0, host_tensor(rows, torch.long, logits.device), additive)

    def _additive_mask(self, bits: np.ndarray) -> torch.Tensor:
        """[G, W] int32 bits (bit j of word w: token 32w + j) -> [G, 32W] of 0 / -inf."""
        num_rows = bits.shape[0]
        num_bytes = num_rows * self.num_words * 4
        host_bits = torch.from_numpy(np.ascontiguousarray(bits))
        if self.device.type == "cuda":
            device_bits = host_bits.pin_memory().to(self.device, non_blocking=True)
        else:
            device_bits = host_bits
        index = self._index[:num_bytes]
        # little-endian words: byte k holds tokens 8k .. 8k + 7, bit j token 8k + j
        index.copy_(device_bits.view(torch.uint8).view(-1))
        out = self._additive[:num_bytes]
        torch.index_select(self._table, 0, index, out=out)
        return out.view(num_rows, self.num_words * 32)

    def _reserve(self, num_rows: int, num_words: int) -> None:
        if num_rows <= self._num_rows and num_words == self.num_words:
            return
        self.num_words = num_words
        self._num_rows = num_rows
        num_bytes = num_rows * self.num_words * 4
        self._index = torch.empty(num_bytes, dtype=torch.int32, device=self.device)
        self._additive = torch.empty(num_bytes, 8, dtype=self._table.dtype, device=self.device)
