"""The sampler on hand-made logits."""

from __future__ import annotations

import pytest
import torch

from tandem.engine.core.sampling_params import SamplingParams
from tandem.engine.exec.request_state import RequestState
from tandem.engine.exec.sampler import Sampler

V = 50


def req(seed: int | None = 0, outputs=(), prompt=(1, 2, 3), eos=(), **params) -> RequestState:
    """The runner's copy of a request, as the sampler reads it."""
    return RequestState(
        request_id=f"r{seed}-{len(outputs)}",
        all_token_ids=[*prompt, *outputs],
        output_token_ids=list(outputs),
        sampling_params=SamplingParams(seed=seed, **params),
        eos_token_ids=tuple(eos),
        generator=torch.Generator().manual_seed(seed if seed is not None else 1234),
        block_ids=[],
        num_computed_tokens=len(prompt) + len(outputs),
    )


def logits(rows: int = 1, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, V, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_argmax():
    x = logits(3)
    out = Sampler()(x, [req(temperature=0) for _ in range(3)])
    assert out.token_ids == x.argmax(-1).tolist()


def test_seeded_draws_do_not_depend_on_the_batch():
    sampler = Sampler()
    alone, batched = req(seed=7), req(seed=7)
    others = [req(seed=s, top_k=5) for s in (1, 2, 3)]
    seq_alone, seq_batched = [], []
    for step in range(20):
        x = logits(4, seed=step)
        seq_alone.append(sampler(x[1:2], [alone]).token_ids[0])
        seq_batched.append(sampler(x, [others[0], batched, others[1], others[2]]).token_ids[1])
    assert seq_alone == seq_batched
    assert len(set(seq_alone)) > 1  # it did sample, not argmax


def test_different_seeds_differ():
    x = torch.zeros(1, V)  # every token as likely: 30 equal draws by chance is 50**-30
    a = [Sampler()(x, [r]).token_ids[0] for r in [req(seed=1)] for _ in range(30)]
    b = [Sampler()(x, [r]).token_ids[0] for r in [req(seed=2)] for _ in range(30)]
    assert a != b


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_draws_follow_the_tempered_distribution(temperature):
    """4,000 draws (400 requests, 10 steps) against softmax(logits / temperature): every
    frequency within five standard errors (a false alarm about once in a million)."""
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    x = torch.full((400, V), float("-inf"))
    x[:, :4] = p.log()
    rows = [req(seed=i, temperature=temperature) for i in range(400)]
    draws = torch.tensor([t for _ in range(10) for t in Sampler()(x, rows).token_ids])
    freq = torch.bincount(draws, minlength=V).float() / len(draws)
    expected = torch.softmax(p.log() / temperature, dim=-1)
    assert freq[4:].sum() == 0
    assert (
        (freq[:4] - expected).abs() <= 5 * (expected * (1 - expected) / len(draws)).sqrt()
    ).all()


def test_tokens_of_probability_zero_are_never_drawn():
    """Filtered tokens between and after the kept ones: flat stretches of the cumulative sum
    that no uniform number may land on, however close to 0 or 1 it is."""
    kept = [0, 7, 8, 31]
    x = torch.full((500, V), float("-inf"))
    x[:, kept] = 0.0
    rows = [req(seed=i) for i in range(500)]
    draws = {t for _ in range(4) for t in Sampler()(x, rows).token_ids}
    assert draws == set(kept)


def test_a_nan_row_still_draws_a_token_of_the_vocabulary():
    x = logits(2)
    x[1, 7] = float("nan")
    out = Sampler()(x, [req(seed=1), req(seed=2)])
    assert all(0 <= t < V for t in out.token_ids)


@pytest.mark.parametrize("k", [1, 3])
def test_top_k_only_draws_from_the_k_best(k):
    x = logits(1)
    allowed = set(x[0].topk(k).indices.tolist())
    r = req(seed=3, top_k=k, temperature=2.0)
    draws = {Sampler()(x, [r]).token_ids[0] for _ in range(200)}
    assert draws <= allowed and (k == 1 or len(draws) > 1)


def test_top_p_keeps_the_nucleus():
    x = torch.full((1, V), -10.0)
    x[0, 4], x[0, 9], x[0, 11] = 5.0, 4.0, 0.0  # p ≈ 0.73, 0.27, 0.005
    r = req(seed=4, top_p=0.9)
    draws = {Sampler()(x, [r]).token_ids[0] for _ in range(300)}
    assert draws == {4, 9}


def test_min_p_drops_unlikely_tokens():
    x = torch.full((1, V), -10.0)
    x[0, 2], x[0, 3] = 3.0, 1.0  # p(3)/p(2) = e^-2 ≈ 0.135
    r_keep, r_drop = req(seed=5, min_p=0.1), req(seed=5, min_p=0.2)
    keep = {Sampler()(x, [r_keep]).token_ids[0] for _ in range(300)}
    drop = {Sampler()(x, [r_drop]).token_ids[0] for _ in range(300)}
    assert keep == {2, 3} and drop == {2}


def test_logit_bias_forces_a_token():
    x = logits(1)
    target = int(x[0].argmin())
    out = Sampler()(x, [req(temperature=0, logit_bias={target: 100.0})])
    assert out.token_ids == [target]


def test_min_tokens_masks_eos_and_stop_tokens_until_reached():
    x = torch.zeros(1, V)
    x[0, 7], x[0, 8], x[0, 9] = 9.0, 8.0, 1.0  # 7 = eos, 8 = stop token
    early = req(temperature=0, eos=(7,), stop_token_ids=[8], min_tokens=2, outputs=[5])
    late = req(temperature=0, eos=(7,), stop_token_ids=[8], min_tokens=2, outputs=[5, 5])
    assert Sampler()(x.repeat(2, 1), [early, late]).token_ids == [9, 7]


def test_penalties():
    x = torch.zeros(1, V)
    x[0, 1], x[0, 2] = 2.0, 1.9
    assert Sampler()(x, [req(temperature=0, outputs=[1])]).token_ids == [1]
    assert Sampler()(x, [req(temperature=0, outputs=[1], frequency_penalty=0.2)]).token_ids == [2]
    assert Sampler()(x, [req(temperature=0, outputs=[1], presence_penalty=0.2)]).token_ids == [2]
    # repetition counts prompt tokens (1, 2, 3) too
    y = torch.zeros(1, V)
    y[0, 1], y[0, 4] = 2.0, 1.5
    assert Sampler()(y, [req(temperature=0, repetition_penalty=1.5)]).token_ids == [4]
    # frequency scales with the count
    z = torch.zeros(1, V)
    z[0, 1], z[0, 2] = 2.0, 1.5
    once = req(temperature=0, outputs=[1], frequency_penalty=0.3)
    twice = req(temperature=0, outputs=[1, 1], frequency_penalty=0.3)
    assert Sampler()(z.repeat(2, 1), [once, twice]).token_ids == [1, 2]


def test_edits_of_a_batch_are_each_rows_own():
    """Bias, penalties and masks gathered for the whole batch change each row exactly as
    that request alone would, and nothing in the rows that ask for none."""
    from tandem.engine.exec.logit_edits import LogitEdits

    requests = [
        req(outputs=[4, 4, 9], frequency_penalty=0.5, presence_penalty=0.25),
        req(temperature=0),
        req(logit_bias={3: -2.0, 10: 1.5, V + 5: 9.0}, repetition_penalty=1.3),
        req(eos=(7,), stop_token_ids=[8], min_tokens=3, outputs=[1]),
    ]
    x = logits(4, seed=3)
    batched = x.clone()
    LogitEdits.collect(requests, V).apply(batched)
    for i, r in enumerate(requests):
        alone = x[i : i + 1].clone()
        LogitEdits.collect([r], V).apply(alone)
        torch.testing.assert_close(batched[i], alone[0], atol=0, rtol=0)
    assert torch.equal(batched[1], x[1])
    assert batched[0, 4] == x[0, 4] - (2 * 0.5 + 0.25) and batched[0, 9] == x[0, 9] - 0.75
    assert batched[3, 7] == batched[3, 8] == float("-inf")


def test_logprobs_are_raw_with_rank_and_top_n():
    x = logits(2)
    rows = [req(temperature=0, logprobs=3), req(seed=9, temperature=5.0, logprobs=0)]
    out = Sampler()(x, rows)
    raw = torch.log_softmax(x, -1)
    for i, lp in enumerate(out.logprobs):
        token = out.token_ids[i]
        assert lp.token_id == token
        assert lp.logprob == pytest.approx(raw[i, token].item(), abs=1e-6)
        assert lp.rank == int((raw[i] > raw[i, token]).sum()) + 1
    assert out.logprobs[0].rank == 1
    assert [t for t, _ in out.logprobs[0].top] == raw[0].topk(3).indices.tolist()
    assert out.logprobs[1].top == ()


def test_no_logprobs_when_not_asked():
    assert Sampler()(logits(1), [req()]).logprobs == [None]
