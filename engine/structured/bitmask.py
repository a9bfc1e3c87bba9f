"""The scheduler's side of the grammar mask: for each constrained sequence due a token, the
tokens its grammar allows next, one bit per vocabulary entry.

llguidance fills the rows on its own thread pool without the GIL, in one call for the
batch. The bits travel in the step's plan (`tandem.engine.core.step_plan.GrammarBitmask`);
the runner turns them into -inf on the logits (`tandem.engine.exec.grammar_mask`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import llguidance
import numpy as np

if TYPE_CHECKING:  # the scheduler imports this module; grammar.py imports transformers
    from tandem.engine.structured.grammar import Grammar


class BitmaskFiller:
    """Owns llguidance's thread pool, made on the first grammar. Reads the matchers without
    advancing them."""

    def __init__(self) -> None:
        self._executor: llguidance.LLExecutor | None = None

    def fill(self, grammars: Sequence[Grammar]) -> np.ndarray:
        """[G, W] int32, row g the tokens `grammars[g]` allows next: bit j of word w allows
        token 32w + j. W covers the grammars' vocabulary. The array is fresh: the caller
        owns it."""
        assert grammars, "no grammar to fill a mask for"
        (vocab_size,) = {g.vocab_size for g in grammars}
        num_words = (vocab_size + 31) // 32
        bits = np.empty((len(grammars), num_words), dtype=np.int32)  # [G, W]
        if self._executor is None:
            self._executor = llguidance.LLExecutor()
        matchers = [(g.matcher, row) for row, g in enumerate(grammars)]
        self._executor.unsafe_compute_mask_ptr(
            matchers, bits.ctypes.data, num_words * 4, len(grammars)
        )
        return bits
