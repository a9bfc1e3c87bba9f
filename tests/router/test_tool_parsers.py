"""Tool-call parsers on text, whole and streamed in any pieces: what a stream sends must
add up to what the whole text parses to."""

from __future__ import annotations

import json

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from tandem.router.tool_parsers import (
    HermesParser,
    Llama3JsonParser,
    MistralParser,
    detect_parser,
)
from tandem.router.tool_stream import ToolCallStream, visible_content

ARGS = st.dictionaries(
    st.text("abcxyz_", min_size=1, max_size=5),
    st.one_of(st.integers(-99, 99), st.text(max_size=6), st.booleans(), st.none()),
    max_size=3,
)
CALLS = st.lists(st.tuples(st.sampled_from(["get_weather", "add", "f-1"]), ARGS), max_size=3)
CONTENT = st.text(st.characters(blacklist_characters="<[{"), max_size=20)


def hermes_text(content: str, calls: list) -> str:
    blocks = [
        "<tool_call>\n" + json.dumps({"name": n, "arguments": a}) + "\n</tool_call>"
        for n, a in calls
    ]
    return content + "\n".join(blocks)


def llama_text(content: str, calls: list) -> str:
    if not calls:
        return content
    return "; ".join(json.dumps({"name": n, "parameters": a}) for n, a in calls)


def mistral_text(content: str, calls: list) -> str:
    if not calls:
        return content
    return content + "[TOOL_CALLS]" + json.dumps([{"name": n, "arguments": a} for n, a in calls])


FORMATS = [
    (HermesParser, hermes_text),
    (Llama3JsonParser, llama_text),
    (MistralParser, mistral_text),
]


def streamed(parser, text: str, cuts: list[int]) -> tuple[str, list[tuple[str, str]], list[str]]:
    """(content, [(name, arguments)], ids) as a client adds up the deltas."""
    stream = ToolCallStream(parser)
    bounds = sorted({c % (len(text) + 1) for c in cuts} | {len(text)})
    content, calls, ids = "", {}, []
    for i, end in enumerate(bounds):
        delta, entries = stream.update(text[:end], final=i == len(bounds) - 1)
        content += delta
        for entry in entries:
            call = calls.setdefault(entry["index"], ["", ""])
            if "id" in entry:
                assert entry["type"] == "function" and entry["function"]["arguments"] == ""
                assert entry["index"] == len(ids)  # one first delta per call, in order
                ids.append(entry["id"])
                call[0] = entry["function"]["name"]
            call[1] += entry["function"]["arguments"]
    return content, [tuple(calls[i]) for i in sorted(calls)], ids


@pytest.mark.parametrize(("parser_class", "render"), FORMATS)
@settings(max_examples=150, deadline=None)
@given(
    content=CONTENT, calls=CALLS, cuts=st.lists(st.integers(0, 10_000), max_size=12), data=st.data()
)
def test_streamed_deltas_add_up_to_the_whole_parse(
    tokenizer, parser_class, render, content, calls, cuts, data
):
    parser = parser_class(tokenizer)
    text = render(content, calls)
    if data.draw(st.booleans()):  # cut short, as max_tokens does
        text = text[: data.draw(st.integers(0, len(text)))]
    whole = parser.parse(text, final=True)
    got_content, got_calls, ids = streamed(parser, text, cuts)
    assert got_content == visible_content(whole, final=True)
    assert got_calls == [(c.name, c.arguments) for c in whole.calls]
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize(("parser_class", "render"), FORMATS)
@settings(max_examples=60, deadline=None)
@given(content=CONTENT, calls=CALLS)
def test_whole_replies_give_back_their_calls(tokenizer, parser_class, render, content, calls):
    parser = parser_class(tokenizer)
    parsed = parser.parse(render(content, calls), final=True)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == calls
    if parser_class is not Llama3JsonParser or not calls:
        assert parsed.content == content


def test_text_that_is_not_a_call_stays_content(tokenizer):
    llama = Llama3JsonParser(tokenizer)
    assert llama.parse('{"answer": 42}', final=True).content == '{"answer": 42}'
    assert llama.parse("Hello", final=False).content == "Hello"
    assert llama.parse("<|python", final=False).content == ""  # maybe the tag
    hermes = HermesParser(tokenizer)
    assert hermes.parse("so <tool_", final=False).content == "so "  # maybe a marker
    assert hermes.parse("so <tool_", final=True).content == "so <tool_"


def test_a_call_with_its_name_last_is_known_once_complete(tokenizer):
    hermes = HermesParser(tokenizer)
    text = '<tool_call>\n{"arguments": {"x": 1}, "name": "f"}\n</tool_call>'
    assert hermes.parse(text[:30], final=False).calls == []
    (call,) = hermes.parse(text, final=True).calls
    assert (call.name, json.loads(call.arguments)) == ("f", {"x": 1})


def test_mistral_call_ids_are_nine_letters_and_digits(tokenizer):
    call_id = MistralParser(tokenizer).new_call_id()
    assert len(call_id) == 9 and call_id.isalnum()
    assert HermesParser(tokenizer).new_call_id().startswith("call_")


def test_the_parser_is_found_from_the_chat_template():
    assert detect_parser("... <tool_call> ...") == "hermes"
    assert detect_parser("{{ '[TOOL_CALLS]' }}") == "mistral"
    assert detect_parser("<|python_tag|>") == "llama3_json"
    assert detect_parser("{{ messages }}") is None and detect_parser(None) is None


class CountingStr(str):
    """A text that counts the characters Python code reads from it one at a time."""

    reads = 0

    def __getitem__(self, key):
        if isinstance(key, int):
            CountingStr.reads += 1
        return super().__getitem__(key)


BAD_NAMES = ['"a\nb"', '"a\\qb"', '"\\ud800"']  # a raw newline, a bad escape, a lone surrogate


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_malformed_call_name_never_raises_and_follows_the_rule(tokenizer, name):
    """A call whose name is not a JSON string is not a call: between hermes or mistral
    markers it is dropped; a llama3 reply that is no call is content."""
    hermes = 'Hi.<tool_call>\n{"name": ' + name + ', "arguments": {}}\n</tool_call>'
    llama = '{"name": ' + name + ', "parameters": {}}'
    mistral = 'Hi.[TOOL_CALLS][{"name": ' + name + ', "arguments": {}}]'
    for parser_class, text, content in [
        (HermesParser, hermes, "Hi."),
        (Llama3JsonParser, llama, llama),
        (MistralParser, mistral, "Hi."),
    ]:
        parser = parser_class(tokenizer)
        whole = parser.parse(text, final=True)
        assert (whole.content, whole.calls) == (content, [])
        got_content, got_calls, _ = streamed(parser, text, list(range(len(text))))
        assert (got_content, got_calls) == (content, [])


JSONISH = st.text(alphabet='{}[]":,\\ \nabq0-', max_size=40)


@pytest.mark.parametrize(("parser_class", "render"), FORMATS)
@settings(max_examples=200, deadline=None)
@given(
    pieces=st.lists(
        st.one_of(
            JSONISH,
            st.sampled_from(
                [
                    "<tool_call>",
                    "</tool_call>",
                    "[TOOL_CALLS]",
                    "<|python_tag|>",
                    '{"name": "',
                    '"arguments": ',
                    '"parameters": ',
                    "true",
                    "nul",
                ]
            ),
        ),
        max_size=8,
    ),
    cuts=st.lists(st.integers(0, 400), max_size=8),
)
def test_any_text_parses_without_raising_and_streams_alike(tokenizer, parser_class, render,
                                                         pieces, cuts):  # fmt: skip
    parser = parser_class(tokenizer)
    text = "".join(pieces)
    whole = parser.parse(text, final=True)
    got_content, got_calls, _ = streamed(parser, text, cuts)
    assert got_content == visible_content(whole, final=True)
    assert got_calls == [(c.name, c.arguments) for c in whole.calls]


@pytest.mark.parametrize(("parser_class", "render"), FORMATS)
def test_streaming_a_long_call_reads_each_character_a_bounded_number_of_times(
    tokenizer, parser_class, render
):
    """Work per piece is the piece's characters, not the text so far: a 20k-character call
    streamed 4 characters at a time reads each character a few times in all (a parse of
    the whole text per piece reads about 50 million)."""
    text = render("Hi.", [("write_file", {"text": "lorem ipsum " * 1700})])
    stream = ToolCallStream(parser_class(tokenizer))
    CountingStr.reads = 0
    for end in [*range(4, len(text), 4), len(text)]:
        stream.update(CountingStr(text[:end]), final=end == len(text))
    num_pieces = len(range(4, len(text), 4)) + 1
    # each character a few times, and a few reads per piece (a call's first bracket, say)
    assert CountingStr.reads < 2 * len(text) + 20 * num_pieces
    assert stream.scan.num_scanned < 2 * len(text) + 20 * num_pieces
    (call,) = parser_class(tokenizer).parse(text, final=True).calls
    assert stream.arguments_sent == [len(call.arguments)]


def test_a_whole_call_with_an_escaped_lone_surrogate_keeps_it_escaped(tokenizer):
    """Arguments re-written from a parsed object must still encode as UTF-8 (the answer's
    body), so a lone surrogate stays an escape."""
    text = '{"parameters": {"x": "\\ud800é"}, "name": "f"}'
    (call,) = Llama3JsonParser(tokenizer).parse(text, final=True).calls
    call.arguments.encode("utf-8")
    assert json.loads(call.arguments) == {"x": "\ud800é"}
