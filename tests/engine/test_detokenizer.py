"""Incremental detokenization against the tokenizer's own full decode."""

from __future__ import annotations

import random

import pytest

from tandem.engine.detokenizer import IncrementalDetokenizer

TEXTS = [
    "Hello world, the cache block is paged.",
    "café naïve façade über straße",
    "東京 日本語 中文 模型 缓存",
    "emoji 😀🚀✨ in a row 😀",
]


def stream(detok: IncrementalDetokenizer, ids: list[int]) -> tuple[str, str | None]:
    """Feed one id at a time; return what would have been streamed and the stop hit."""
    pieces, hit = [], None
    for token_id in ids:
        hit = detok.update([token_id])
        pieces.append(detok.take_delta(finished=hit is not None))
        if hit:
            break
    detok.flush()
    pieces.append(detok.take_delta(finished=True))
    return "".join(pieces), hit


@pytest.mark.parametrize("text", TEXTS)
def test_streamed_text_equals_the_full_decode(tokenizer, text):
    ids = tokenizer.encode(text)
    detok = IncrementalDetokenizer(tokenizer, prompt_token_ids=[5, 6, 7])
    streamed, hit = stream(detok, ids)
    assert hit is None
    assert streamed == tokenizer.decode(ids) == text
    assert detok.output_text == text


def test_no_replacement_character_mid_character(tokenizer):
    ids = tokenizer.encode("😀")
    assert len(ids) > 1  # a 4-byte character split across byte-level tokens
    detok = IncrementalDetokenizer(tokenizer, [])
    deltas = []
    for token_id in ids:
        detok.update([token_id])
        deltas.append(detok.take_delta(finished=False))
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == "😀"


def test_random_token_streams_match_full_decode(tokenizer):
    rng = random.Random(0)
    for _ in range(20):
        ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randint(1, 30))]
        detok = IncrementalDetokenizer(tokenizer, [])
        streamed, _ = stream(detok, ids)
        assert streamed == tokenizer.decode(ids, skip_special_tokens=True)


def test_skip_special_tokens(tokenizer):
    eos = tokenizer.convert_tokens_to_ids("</s>")
    ids = [*tokenizer.encode("ab"), eos, *tokenizer.encode("cd")]
    kept = IncrementalDetokenizer(tokenizer, [], skip_special_tokens=False)
    skipped = IncrementalDetokenizer(tokenizer, [], skip_special_tokens=True)
    assert stream(kept, ids)[0] == "ab</s>cd"
    assert stream(skipped, ids)[0] == "abcd"


@pytest.mark.parametrize("stop", ["cache block", "é", "京 日", "😀🚀"])
def test_stop_string_spanning_tokens_is_never_emitted(tokenizer, stop):
    text = next(t for t in TEXTS if stop in t)
    ids = tokenizer.encode(text)
    detok = IncrementalDetokenizer(tokenizer, [], stop=[stop])
    streamed, hit = stream(detok, ids)
    assert hit == stop
    assert streamed == text[: text.index(stop)]
    assert stop not in streamed


def test_earliest_of_several_stop_strings_wins(tokenizer):
    ids = tokenizer.encode("the model token cache")
    detok = IncrementalDetokenizer(tokenizer, [], stop=["cache", "model"])
    streamed, hit = stream(detok, ids)
    assert (streamed, hit) == ("the ", "model")


def test_include_stop_str_in_output(tokenizer):
    ids = tokenizer.encode("serve fast paged memory")
    detok = IncrementalDetokenizer(tokenizer, [], stop=["fast"], include_stop_str_in_output=True)
    assert stream(detok, ids) == ("serve fast", "fast")


def test_held_back_text_is_released_when_no_stop_follows(tokenizer):
    ids = tokenizer.encode("cach")
    detok = IncrementalDetokenizer(tokenizer, [], stop=["cache"])
    for token_id in ids:
        detok.update([token_id])
    assert detok.take_delta(finished=False) == ""  # could still become "cache"
    assert detok.take_delta(finished=True) == "cach"
