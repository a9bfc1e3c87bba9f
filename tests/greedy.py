"""Greedy tokens computed along two paths (another batching, kernel or library) against
each other.

Two paths sum in another order, so their logits differ by float32 rounding, and which
kernels run (hence the rounding) depends on the CPU. Where the two best tokens of a step
are closer than that rounding, either choice is right; from there on the two continuations
follow different contexts and are not comparable. Anywhere else the tokens must be equal.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch


def logit_rounding(num_keys: int, scale: float = 20.0) -> float:
    """How far apart two paths may put the tiny models' logits by float32 rounding alone,
    for sequences of up to `num_keys` tokens. A float32 sum of K terms may be off by K * eps
    of its terms' scale; each of the 2 layers chains sums over 64 and 128 features, a head of
    16 and `num_keys` keys, then the LM head sums over 64; and the logits reach about `scale`
    (20). A generous bound (rounding errors mostly cancel); a real bug moves logits more."""
    terms = 2 * (64 + 128 + 64 + 64 + 16 + num_keys) + 64
    return terms * torch.finfo(torch.float32).eps * scale


# Any sequence the tests' nodes take (512 tokens): about 1700 terms, 1.2e-7 each, times 20.
LOGIT_ROUNDING = logit_rounding(512)  # ≈ 4e-3
# Two tokens whose logits are closer than this may come out in either order: each can move.
NEAR_TIE = 2 * LOGIT_ROUNDING


def assert_greedy_agrees(
    got: list[int], want: list[int], gap_below_best: Callable[[int, int], float], what: str = ""
) -> None:
    """`got` equals the reference `want`, or equals it up to a step where `got` took a token
    less than NEAR_TIE below that step's best (`gap_below_best(step, token)`, from the
    reference's logits); the rest is then not compared."""
    for step, (ours, theirs) in enumerate(zip(got, want)):
        if ours != theirs:
            gap = gap_below_best(step, ours)
            assert gap <= NEAR_TIE, (
                f"{what}: step {step} took {ours}, {gap:.2e} below the best ({theirs}); "
                f"more than float32 rounding ({NEAR_TIE:.1e})\n got {got}\nwant {want}"
            )
            return
    assert len(got) == len(want), f"{what}: {len(got)} tokens, not {len(want)}"


def logprob_gap(output) -> Callable[[int, int], float]:
    """`gap_below_best` from a completion generated with `logprobs >= 2` (raw logprobs: their
    differences are the logits')."""

    def gap(step: int, token: int) -> float:
        top = output.logprobs[step].top
        found = [lp for t, lp in top if t == token]
        return top[0][1] - found[0] if found else math.inf

    return gap


def assert_well_separated(output, what: str = "") -> None:
    """Every step of a greedy completion (generated with `logprobs >= 2`) chose a token more
    than NEAR_TIE above the next best, so no other path's rounding can change it: a test that
    compares such tokens or their text exactly does not depend on the machine."""
    for step, lp in enumerate(output.logprobs):
        gap = lp.top[0][1] - lp.top[1][1]
        assert gap > NEAR_TIE, (
            f"{what}: step {step} is a near-tie ({gap:.1e}): another batching may choose "
            "either token; compare with `assert_greedy_agrees` or choose another prompt"
        )
