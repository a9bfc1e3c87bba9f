"""Structured outputs in the engine: the grammar masks the sampler's logits, advances with
every appended token, and ends its request once complete; on the tiny random model, whose
free output is noise, so every valid result is the grammar's doing."""

from __future__ import annotations

import dataclasses
import json
import re

import jsonschema
import pytest
import torch

from tandem.engine import LLM, SamplingParams
from tandem.engine.exec.grammar_mask import GrammarMask
from tandem.engine.structured.bitmask import BitmaskFiller
from tandem.engine.structured.grammar import GrammarCompiler, InvalidGrammar
from tandem.engine.structured.spec import StructuredOutputsParams as Spec

# Every instance is short (bounded strings, numbers and arrays, no extra keys).
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["red", "blue"]}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
PROMPTS = ["Hello there", "The cache", "a b c d e f g"]


@pytest.fixture(autouse=True)
def no_leaks(llm):
    yield
    assert not llm.engine.has_unfinished_requests()
    assert llm.engine.check_integrity().in_use == 0


def generate(llm, params, prompts=PROMPTS):
    return [o.outputs for o in llm.generate(prompts, params, use_tqdm=False)]


def test_json_schema_outputs_validate_and_stop_when_complete(llm):
    params = SamplingParams(max_tokens=200, seed=3, n=3, structured_outputs=Spec(json=SCHEMA))
    for outputs in generate(llm, params):
        for out in outputs:
            jsonschema.validate(json.loads(out.text), SCHEMA)
            # the closing brace ends it: no end-of-sequence token needed, none in the text
            assert out.finish_reason == "stop" and out.stop_reason is None
            assert llm.tokenizer.decode(out.token_ids) == out.text


def test_regex_choice_and_json_object(llm):
    cases = [
        (Spec(regex=r"[a-z]{2,4}-[0-9]{3}"), lambda t: re.fullmatch(r"[a-z]{2,4}-[0-9]{3}", t)),
        (Spec(choice=["yes", 'no, "never"']), lambda t: t in ("yes", 'no, "never"')),
    ]
    for spec, valid in cases:
        params = SamplingParams(max_tokens=60, seed=1, temperature=1.0, structured_outputs=spec)
        for (out,) in generate(llm, params):
            assert valid(out.text), (spec, out.text)
            assert out.finish_reason == "stop"
    # any object: its keys are free strings, which a random model may not close in time
    params = SamplingParams(max_tokens=100, seed=1, structured_outputs=Spec(json_object=True))
    outputs = [out for (out,) in generate(llm, params)]
    assert all(out.text.startswith("{") for out in outputs)
    for out in outputs:
        if out.finish_reason == "stop":
            assert isinstance(json.loads(out.text), dict)


def test_a_grammar_ends_the_output_whatever_min_tokens_and_ignore_eos_say(llm):
    spec = Spec(choice=["yes", "no"])
    params = SamplingParams(max_tokens=50, min_tokens=10, ignore_eos=True, structured_outputs=spec)
    (out,) = generate(llm, params, ["Hello"])[0]
    assert out.text in ("yes", "no") and out.finish_reason == "stop"


def test_max_tokens_mid_grammar_ends_with_length_and_a_prefix(llm):
    full = SamplingParams(max_tokens=200, seed=5, structured_outputs=Spec(json=SCHEMA))
    cut = dataclasses.replace(full, max_tokens=4)
    (whole,) = generate(llm, full, ["Hello"])[0]
    (short,) = generate(llm, cut, ["Hello"])[0]
    assert short.finish_reason == "length" and len(short.token_ids) == 4
    assert short.token_ids == whole.token_ids[:4]


def test_a_stop_string_cuts_a_grammar_output(llm):
    spec = Spec(regex=r"abc-[0-9]{4}")
    params = SamplingParams(max_tokens=40, seed=2, stop=["-"], structured_outputs=spec)
    (out,) = generate(llm, params, ["Hello"])[0]
    assert out.text == "abc" and out.finish_reason == "stop" and out.stop_reason == "-"


def test_grammar_requests_leave_their_batch_alone_and_follow_their_seed(llm):
    plain = SamplingParams(max_tokens=12, temperature=1.0, seed=11, ignore_eos=True)
    shaped = SamplingParams(max_tokens=80, seed=4, structured_outputs=Spec(json=SCHEMA))
    alone = generate(llm, plain, ["The model"])[0][0].token_ids
    mixed = generate(llm, [shaped, plain, shaped], ["Hi", "The model", "Hello there"])
    assert mixed[1][0].token_ids == alone
    again = generate(llm, shaped, ["Hello there"])[0][0]
    assert again.token_ids == mixed[2][0].token_ids


def test_preempted_requests_keep_their_matcher(llama_dir):
    """Preemption recomputes a request's tokens without resampling them: its matcher,
    already past them, must not see them twice."""
    prompts = [[5 + i] * (20 + 7 * i) for i in range(6)]
    params = [
        SamplingParams(max_tokens=60, seed=s, structured_outputs=Spec(json=SCHEMA))
        for s in range(6)
    ]
    roomy = LLM(str(llama_dir), dtype="float32", num_kv_blocks=64)
    tight = LLM(str(llama_dir), dtype="float32", num_kv_blocks=12, max_num_batched_tokens=32)
    expected = roomy.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    got = tight.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    assert tight.engine.scheduler.num_preemptions > 0
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in expected]
    for output in got:
        if output.outputs[0].finish_reason == "stop":
            jsonschema.validate(json.loads(output.outputs[0].text), SCHEMA)
    assert tight.engine.check_integrity().in_use == 0


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (Spec(json={"type": "strng"}), "Invalid type"),
        (Spec(json={"type": "string", "not": {"const": "a"}}), "not"),
        (Spec(json={"type": "array", "uniqueItems": True}), "uniqueItems"),
        (Spec(json={"type": "integer", "minimum": 5, "maximum": 1}), "minimum"),
        (Spec(regex="a(b"), "unclosed group"),
        (Spec(grammar="start: foo"), "foo"),
    ],
)
def test_specs_that_do_not_compile_are_refused_before_anything_is_queued(llm, spec, message):
    with pytest.raises(InvalidGrammar, match=message):
        llm.generate(["a", "b"], SamplingParams(structured_outputs=spec), use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()


def test_compiled_grammars_are_cached_by_the_spec_not_its_key_order(tokenizer):
    compiler = GrammarCompiler(tokenizer, len(tokenizer), [2])
    a = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    b = {"required": ["x"], "properties": {"x": {"type": "integer"}}, "type": "object"}
    first = compiler.matcher(Spec(json=a))
    second = compiler.matcher(Spec(json=b))
    assert compiler.num_cached == 1
    assert first.matcher is not second.matcher  # each request gets its own copy
    assert first.accept(tokenizer.encode("{")[0]) and second.matcher.is_accepting() is False


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({}, "exactly one"),
        ({"regex": "a", "choice": ["a"]}, "exactly one"),
        ({"choice": []}, "choice"),
        ({"json": "{not json"}, "not JSON"),
        ({"grammar": 3}, "grammar"),
        ({"jsn": {}}, "unknown"),
    ],
)
def test_structured_outputs_params_are_checked(fields, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(structured_outputs=fields)


def test_the_spec_travels_as_plain_data():
    params = SamplingParams(seed=1, structured_outputs=Spec(json='{"type": "object"}'))
    wire = json.loads(json.dumps(dataclasses.asdict(params)))
    assert SamplingParams(**wire) == params
    assert wire["structured_outputs"]["json"] == {"type": "object"}


def test_the_mask_allows_exactly_the_grammar_tokens_and_only_on_grammar_rows(tokenizer):
    vocab = len(tokenizer)
    compiler = GrammarCompiler(tokenizer, vocab, [2])
    grammar = compiler.matcher(Spec(regex=r"(ab|cd)[0-9]"))
    for token in tokenizer.encode("ab"):
        assert grammar.accept(token)  # now a digit must follow
    bits = BitmaskFiller().fill([grammar])  # row 1's grammar; row 0 has none
    logits = torch.randn(2, vocab)  # [S, V]
    before = logits.clone()
    GrammarMask(vocab, torch.float32, torch.device("cpu")).apply(logits, [1], bits)
    allowed = torch.isfinite(logits[1]).nonzero().flatten().tolist()
    texts = {t: tokenizer.decode([t]) for t in allowed}
    assert texts and all(re.fullmatch(r"[0-9]+", s) for s in texts.values()), texts
    digits = [t for t in range(vocab) if re.fullmatch(r"[0-9]", tokenizer.decode([t]))]
    assert set(digits) <= set(allowed)
    assert torch.equal(logits[0], before[0])  # no grammar: untouched
    assert torch.equal(logits[1][allowed], before[1][allowed])  # allowed: unchanged


def test_chat_renders_tools_and_a_named_call_grammar_holds(llm):
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}
    messages = [{"role": "user", "content": "Weather?"}]
    grammar = 'start: "<tool_call>\\n" %json ' + json.dumps(
        {"type": "object", "properties": {"name": {"const": "get_weather"}, "arguments": SCHEMA},
         "required": ["name", "arguments"], "additionalProperties": False,
         "x-guidance": {"whitespace_flexible": False}}
    ) + ' "\\n</tool_call>"'  # fmt: skip
    params = SamplingParams(max_tokens=200, seed=2, structured_outputs=Spec(grammar=grammar))
    (plain,) = llm.chat(messages, SamplingParams(max_tokens=1), use_tqdm=False)
    (out,) = llm.chat(messages, params, tools=[tool], use_tqdm=False)
    assert len(out.prompt_token_ids) > len(plain.prompt_token_ids) + 50  # the signatures
    text = out.outputs[0].text
    assert text.startswith("<tool_call>\n") and text.endswith("\n</tool_call>")
    call = json.loads(text[len("<tool_call>\n") : -len("\n</tool_call>")])
    assert call["name"] == "get_weather"
    jsonschema.validate(call["arguments"], SCHEMA)


def test_a_tokenizer_with_more_tokens_than_the_model_has_logits(tokenizer):
    """A tokenizer may count an added token the model has no logit for: llguidance takes
    the tokenizer's size, and the masks are cut to the logits."""
    vocab = len(tokenizer) - 1  # the model's logits: one fewer
    compiler = GrammarCompiler(tokenizer, vocab, [2])
    compiler.prepare()
    assert compiler.unavailable is None
    grammar = compiler.matcher(Spec(regex=r"[0-9]"))
    assert grammar.vocab_size == len(tokenizer)
    bits = BitmaskFiller().fill([grammar])
    logits = torch.randn(1, vocab)  # [S, V]
    GrammarMask(vocab, torch.float32, torch.device("cpu")).apply(logits, [0], bits)
    allowed = torch.isfinite(logits[0]).nonzero().flatten().tolist()
    assert allowed and all(re.fullmatch(r"[0-9]+", tokenizer.decode([t])) for t in allowed)


class RefusedTokenizer:
    """A tokenizer llguidance cannot take (not a fast one)."""

    def __len__(self) -> int:
        return 10


def test_a_tokenizer_llguidance_refuses_leaves_plain_requests_and_a_clear_error():
    compiler = GrammarCompiler(RefusedTokenizer(), 10, [2])
    compiler.prepare()  # does not raise: the node starts
    assert "not available for this model" in compiler.unavailable
    with pytest.raises(InvalidGrammar, match="not available for this model"):
        compiler.validate(Spec(regex="a"))
