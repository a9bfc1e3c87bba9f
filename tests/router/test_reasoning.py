"""Reasoning parsers on text, whole and streamed in any pieces; the parser found from real
chat templates; and grammars that start after `</think>`, sampled by the engine's sampler
from random logits over Qwen3's real vocabulary (and the tiny model's, where the tag is
plain text)."""

from __future__ import annotations

import itertools
import json
import re

import jsonschema
import pytest
import torch
from transformers import AutoTokenizer

from tandem.engine.core.request import Request
from tandem.engine.core.sampling_params import SamplingParams
from tandem.engine.exec.request_state import RequestState
from tandem.engine.exec.sampler import GrammarRows, Sampler
from tandem.engine.structured.bitmask import BitmaskFiller
from tandem.engine.structured.grammar import GrammarCompiler
from tandem.engine.structured.spec import StructuredOutputsParams
from tandem.router.preprocess import ModelLimits, Preprocessor
from tandem.router.protocol import ChatCompletionRequest
from tandem.router.reasoning import (
    DeepSeekR1Parser,
    Qwen3Parser,
    Reasoned,
    ReasoningStream,
    detect_reasoning_parser,
    thinking_switch,
)
from tandem.router.reasoning_grammar import after_reasoning
from tandem.router.tool_parsers import HermesParser
from tests.assets import llama_cpp_template, npm_tokenizer

# (parser, reply, its reasoning, its content)
WHOLE = [
    (Qwen3Parser(), "<think>\nlet me see</think>\n\nParis.", "\nlet me see", "\n\nParis."),
    (Qwen3Parser(), "  <think>a<b</think>c", "a<b", "c"),
    (Qwen3Parser(), "Paris, no thinking.", None, "Paris, no thinking."),
    (Qwen3Parser(), "<think>cut off inside", "cut off inside", ""),
    (Qwen3Parser(), "<thin", None, "<thin"),  # a tag's start, and then the reply ended
    (DeepSeekR1Parser(), "let me see</think>Paris.", "let me see", "Paris."),
    (DeepSeekR1Parser(), "<think>opened anyway</think>ok", "opened anyway", "ok"),
    (DeepSeekR1Parser(), "cut off inside </thi", "cut off inside </thi", ""),
    (DeepSeekR1Parser(), "</think>", "", ""),
]
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}, "days": {"type": "integer"}},
    "required": ["city", "days"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(("parser", "text", "reasoning", "content"), WHOLE)
def test_a_whole_reply_splits_into_reasoning_and_content(parser, text, reasoning, content):
    assert parser.split(text, final=True) == Reasoned(reasoning, content)


def stream(parser, pieces: list[str]) -> tuple[str, str]:
    state, text, reasoning, content = ReasoningStream(parser), "", "", ""
    for i, piece in enumerate(pieces):
        text += piece
        r, c, _content_start = state.update(text, final=i == len(pieces) - 1)
        reasoning, content = reasoning + r, content + c
    return reasoning, content


@pytest.mark.parametrize(("parser", "text", "reasoning", "content"), WHOLE)
def test_streamed_deltas_add_up_whatever_the_split(parser, text, reasoning, content):
    """Split in two at every position (inside each tag too), and one character at a time:
    nothing is sent that the whole reply's split takes back."""
    want = (reasoning or "", content)
    for cut in range(len(text) + 1):
        assert stream(parser, [text[:cut], text[cut:]]) == want, cut
    assert stream(parser, list(text)) == want
    growing = [parser.split(text[:n], final=False) for n in range(len(text) + 1)]
    for shorter, longer in itertools.pairwise(growing):
        assert (longer.reasoning or "").startswith(shorter.reasoning or "")
        assert longer.content.startswith(shorter.content)


class Reads(str):
    """A text that counts the characters searched (`find`) and sliced out of it."""

    reads = 0

    def find(self, sub, start=0, *rest):
        Reads.reads += len(self) - start
        return super().find(sub, start, *rest)

    def __getitem__(self, key):
        got = super().__getitem__(key)
        Reads.reads += len(got)
        return got


@pytest.mark.parametrize("parser", [Qwen3Parser(), DeepSeekR1Parser()])
def test_streaming_a_long_reasoning_reads_each_character_a_bounded_number_of_times(parser):
    """Work per piece is the piece's characters: 24k characters of reasoning streamed 4 at a
    time read each character a few times in all (a split of the whole text per piece
    reads about 70 million)."""
    text = "<think>" + "lorem ipsum " * 2000 + "</think>The answer."
    state, pieces = ReasoningStream(parser), []
    Reads.reads = 0
    for end in [*range(4, len(text), 4), len(text)]:
        pieces.append(state.update(Reads(text[:end]), final=end == len(text)))
    assert Reads.reads < 3 * len(text) + 40 * len(pieces)
    assert "".join(p[0] for p in pieces) == "lorem ipsum " * 2000
    assert "".join(p[1] for p in pieces) == "The answer."


def test_the_prompt_has_the_first_say():
    qwen3 = Qwen3Parser()
    assert qwen3.for_prompt("<|im_start|>assistant\n<think>\n\n</think>\n\n") is None
    assert qwen3.for_prompt("<|im_start|>assistant\n<think>\n").starts_inside
    assert qwen3.for_prompt("<|im_start|>assistant\n") is qwen3


@pytest.fixture(scope="module")
def qwen3_tokenizer():
    return AutoTokenizer.from_pretrained(npm_tokenizer("qwen3"))


@pytest.mark.parametrize(
    ("template", "found"),
    [
        (None, "qwen3"),  # Qwen3's own: the model opens <think>
        ("Qwen-QwQ-32B.jinja", "deepseek_r1"),  # the generation prompt opens it
        ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "deepseek_r1"),
        ("Qwen-Qwen2.5-7B-Instruct.jinja", None),  # no <think> at all
    ],
)
def test_the_parser_is_found_from_the_chat_template(qwen3_tokenizer, template, found):
    tokenizer = qwen3_tokenizer.__class__.from_pretrained(qwen3_tokenizer.name_or_path)
    if template is not None:
        tokenizer.chat_template = llama_cpp_template(template)
    assert detect_reasoning_parser(tokenizer) == found


def test_enable_thinking_false_reaches_the_template_and_turns_reasoning_off(qwen3_tokenizer):
    limits = ModelLimits("qwen3", len(qwen3_tokenizer), 4096, 16, (qwen3_tokenizer.eos_token_id,))
    pre = Preprocessor(qwen3_tokenizer, limits)
    messages = [{"role": "user", "content": "Hi"}]
    off = ChatCompletionRequest(messages=messages, chat_template_kwargs={"enable_thinking": False})
    prompt = pre.chat_prompt(off)
    assert "<think>\n\n</think>" in qwen3_tokenizer.decode(prompt.token_ids)
    assert pre.reasoning_for(prompt) is None
    on = pre.chat_prompt(ChatCompletionRequest(messages=messages))
    assert pre.reasoning_for(on) is pre.reasoning and pre.reasoning.name == "qwen3"


@pytest.mark.parametrize(
    ("template", "switch"),
    [
        (None, "enable_thinking"),  # Qwen3's own
        ("deepseek-ai-DeepSeek-V3.1.jinja", "enable_thinking"),  # llama.cpp's takes both
        ("{% if thinking %}<think>{% endif %}", "thinking"),  # DeepSeek-V3.1's own reads this
        ("Qwen-Qwen2.5-7B-Instruct.jinja", None),
    ],
)
def test_the_thinking_switch_is_the_variable_the_template_reads(qwen3_tokenizer, template, switch):
    tokenizer = qwen3_tokenizer.__class__.from_pretrained(qwen3_tokenizer.name_or_path)
    if template is not None:
        is_file = template.endswith(".jinja")
        tokenizer.chat_template = llama_cpp_template(template) if is_file else template
    assert thinking_switch(tokenizer) == switch


def reason_then_sample(tokenizer, spec, reasoning: str, seed: int) -> str:
    """The reply when the model reasons `reasoning` (fed as its tokens), then samples
    random logits [1, V] with the engine's sampler under the spec wrapped to start after
    the reasoning."""
    compiler = GrammarCompiler(tokenizer, len(tokenizer), (tokenizer.eos_token_id,))
    forced = tokenizer.encode(reasoning, add_special_tokens=False)
    wrapped = after_reasoning(spec, tokenizer, (tokenizer.eos_token_id,))
    return tokenizer.decode(forced + sample_after(compiler, wrapped, forced, seed, len(tokenizer)))


def sample_after(compiler, spec, forced: list[int], seed: int, vocab: int) -> list[int]:
    request = Request(f"r{seed}", [1], SamplingParams(seed=seed, max_tokens=400))
    request.grammar = compiler.matcher(spec)
    state = RequestState(request.request_id, [1], [], request.sampling_params, (),
                         torch.Generator().manual_seed(seed), [], 0)  # fmt: skip
    eos = compiler.eos_token_ids
    for token in forced:  # the reasoning: any text, until </think>; never the end
        assert not set(allowed(request.grammar, eos)) or token in eos
        request.append_output_token(token)
        state.append_token(token)
        assert not request.grammar.is_error, request.grammar.error
    sampler, generator, bitmasks = Sampler(), torch.Generator().manual_seed(seed), BitmaskFiller()
    while not request.grammar.is_terminated and request.num_output_tokens < 400:
        logits = torch.randn(1, vocab, generator=generator) * 3
        bits = bitmasks.fill([request.grammar])
        (token,) = sampler(logits, [state], GrammarRows([0], bits)).token_ids
        request.append_output_token(token)
        state.append_token(token)
    assert request.grammar.is_terminated and not request.grammar.is_error
    return request.output_token_ids[len(forced) :]


def allowed(grammar, token_ids: list[int]) -> list[int]:
    """Those of `token_ids` the grammar allows next."""
    bits = BitmaskFiller().fill([grammar])[0]
    return [t for t in token_ids if (int(bits[t // 32]) >> (t % 32)) & 1]


REASONING = '<think>\nThey want {"city": ...} <tool_call> maybe </thi no: "quotes"\n</think>'


@pytest.mark.parametrize("seed", range(3))
def test_a_schema_applies_only_after_the_reasoning(qwen3_tokenizer, seed):
    spec = StructuredOutputsParams(json=SCHEMA)
    reply = reason_then_sample(qwen3_tokenizer, spec, REASONING, seed)
    split = Qwen3Parser().split(reply, final=True)
    assert split.reasoning == REASONING[len("<think>") : -len("</think>")]
    jsonschema.validate(json.loads(split.content), SCHEMA)


def test_a_forced_tool_call_comes_after_the_reasoning(qwen3_tokenizer):
    parser = HermesParser(qwen3_tokenizer)
    grammar = parser.grammar([{"name": "get_weather", "parameters": SCHEMA}], parallel=False)
    reply = reason_then_sample(qwen3_tokenizer, StructuredOutputsParams(grammar=grammar),
                               REASONING, 0)  # fmt: skip
    content = Qwen3Parser().split(reply, final=True).content
    (call,) = parser.parse(content, final=True).calls
    assert call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), SCHEMA)


PLAIN_SPECS = {  # a spec, and whether an answer is one it allows
    "json": (StructuredOutputsParams(json=SCHEMA), lambda a: valid_json(a, SCHEMA)),
    "regex": (StructuredOutputsParams(regex=r"(yes|no)/[0-9]{2}"),
              lambda a: bool(re.fullmatch(r"(yes|no)/[0-9]{2}", a))),
    "choice": (StructuredOutputsParams(choice=["left", "right"]),
               lambda a: a in ("left", "right")),
    "grammar": (StructuredOutputsParams(grammar='start: "a" b\nb: /[xy]+/ "!"'),
                lambda a: bool(re.fullmatch(r"a[xy]+!", a))),
}  # fmt: skip


@pytest.mark.parametrize("kind", PLAIN_SPECS)
def test_where_the_tag_is_plain_text_the_reasoning_ends_at_the_first_one(tokenizer, kind):
    """The tiny model's tokenizer spells `</think>` with several tokens; DeepSeek-R1's way
    (no opening tag), with false starts of the tag inside the reasoning."""
    spec, holds = PLAIN_SPECS[kind]
    reasoning = "hmm </ <thin </thinx> <think"
    for seed in range(2):
        reply = reason_then_sample(tokenizer, spec, reasoning + "</think>\n", seed)
        split = DeepSeekR1Parser().split(reply, final=True)
        assert split.reasoning == reasoning, reply
        assert holds(split.content.lstrip()), reply


def valid_json(text: str, schema: dict) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def test_the_flag_offers_every_parser():
    from tandem.router import cli, reasoning

    assert cli.REASONING_PARSER_CHOICES == reasoning.REASONING_PARSER_CHOICES
