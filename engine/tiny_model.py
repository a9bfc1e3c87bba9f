"""Write a small random checkpoint that both Tandem and transformers load.

`tandem make-model DIR --arch llama|qwen2|qwen3|mistral` (or `python -m
tandem.engine.tiny_model DIR ...`) writes config.json, safetensors weights and a byte-level
BPE tokenizer trained here on generated text, with a ChatML chat template that renders
tools the Hermes/Qwen way (so the router's tool calling runs end to end on it). Weights are drawn
with a large spread so greedy decoding has clear winners (random 0.02-std models tie
constantly, which makes exact comparisons meaningless).
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

ARCHS = ("llama", "mistral", "qwen2", "qwen3")
SIZES = {
    # name: hidden, intermediate, layers, heads, kv_heads, head_dim, vocab
    "tiny": (64, 128, 2, 4, 2, 16, 512),
    "small": (256, 768, 4, 8, 4, 32, 2048),
    # ~35M parameters (140 MB in float32): enough for per-rank memory to show in benchmarks
    "medium": (512, 2048, 8, 8, 4, 64, 4096),
}
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
# ChatML; with tools, Hermes/Qwen2.5's way: the signatures in the system turn, calls as
# <tool_call> blocks, results as <tool_response> blocks in a user turn. (The markers are
# plain text to this tokenizer, spelled with several tokens.)
_TOOLS_SYSTEM = (
    "{% if tools %}{{ '<|im_start|>system\n' }}"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\n\n' }}{% endif %}"
    "{{ '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}"
    "{% for tool in tools %}{{ '\n' + (tool | tojson) }}{% endfor %}"
    "{{ '\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    "<|im_end|>\n' }}{% endif %}"
)
_TOOL_CALLS = (
    "{{ '<|im_start|>assistant\n' + (message['content'] or '') }}"
    "{% for call in message['tool_calls'] %}"
    "{% set fn = call['function'] if call['function'] is defined else call %}"
    "{{ '<tool_call>\n{\"name\": \"' + fn['name'] + '\", \"arguments\": ' "
    "+ (fn['arguments'] | tojson) + '}\n</tool_call>' }}"
    "{% endfor %}{{ '<|im_end|>\n' }}"
)
CHAT_TEMPLATE = (
    _TOOLS_SYSTEM + "{% for message in messages %}"
    "{% if tools and loop.first and message['role'] == 'system' %}"
    "{% elif message['role'] == 'tool' %}"
    "{{ '<|im_start|>user\n<tool_response>\n' + message['content'] "
    "+ '\n</tool_response><|im_end|>\n' }}"
    "{% elif message['role'] == 'assistant' and message['tool_calls'] %}" + _TOOL_CALLS + ""
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_WORDS = [
    "the",
    "a",
    "of",
    "to",
    "and",
    "in",
    "is",
    "it",
    "that",
    "for",
    "on",
    "with",
    "as",
    "was",
    "by",
    "at",
    "be",
    "this",
    "are",
    "from",
    "or",
    "have",
    "an",
    "model",
    "token",
    "cache",
    "block",
    "prefill",
    "decode",
    "router",
    "request",
    "stream",
    "batch",
    "queue",
    "kernel",
    "tensor",
    "serve",
    "fast",
    "paged",
    "memory",
    "layer",
    "head",
    "query",
    "key",
    "value",
    "attention",
    "sample",
    "greedy",
    "seed",
    "café",
    "naïve",
    "façade",
    "über",
    "straße",
    "東京",
    "日本語",
    "中文",
    "模型",
    "缓存",
    "😀",
    "🚀",
    "✨",
    "ünïcödé",
]


def _corpus(num_lines: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(num_lines):
        words = rng.choices(_WORDS, k=rng.randint(4, 16))
        line = " ".join(words)
        lines.append(line[0].upper() + line[1:] + rng.choice([".", "!", "?", ",", ":"]))
    return lines


def build_tokenizer(vocab_size: int, seed: int = 0):
    """A byte-level BPE tokenizer (any text encodes) trained on generated text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(4000, seed), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        chat_template=CHAT_TEMPLATE,
    )


def _hf_config(
    arch: str, size: str, vocab_size: int, max_len: int, sliding_window: int | None = None
):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    hidden, inter, layers, heads, kv_heads, head_dim, _ = SIZES[size]
    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_len,
        rms_norm_eps=1e-5,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    if arch == "llama":
        scaling = dict(
            rope_type="llama3",
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=64,
        )
        return LlamaConfig(**common, head_dim=head_dim, rope_scaling=scaling, rope_theta=50000.0)
    if arch == "mistral":
        return MistralConfig(**common, head_dim=head_dim, sliding_window=sliding_window)
    if arch == "qwen2":
        return Qwen2Config(**common, tie_word_embeddings=True, use_sliding_window=False)
    if arch == "qwen3":
        # An explicit head_dim unlike hidden/heads, as real Qwen3 checkpoints have.
        return Qwen3Config(
            **common, head_dim=head_dim * 2, tie_word_embeddings=True, use_sliding_window=False
        )
    raise ValueError(f"unknown arch {arch!r}; choose one of {', '.join(ARCHS)}")


@torch.no_grad()
def _randomize(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=gen))
        elif name.endswith("bias"):
            param.copy_(0.1 * torch.randn(param.shape, generator=gen))
        else:
            std = 0.5 if "embed" in name or "lm_head" in name else 0.3
            param.copy_(std * torch.randn(param.shape, generator=gen))


def make_model(
    out_dir: str | Path,
    arch: str = "llama",
    size: str = "tiny",
    seed: int = 0,
    max_len: int = 2048,
    max_shard_size: str | None = None,
    sliding_window: int | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
) -> Path:
    """Write the checkpoint and tokenizer into `out_dir` (created) and return it.
    `sliding_window` (mistral only) makes every query see only its last that many tokens.
    `tokenizer` (default: one trained here) sets the vocabulary, say a real model's for a
    benchmark whose costs grow with it."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")
    if sliding_window is not None and arch != "mistral":
        raise ValueError("a sliding window is only made for --arch mistral")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    eos = [2, 4]
    if tokenizer is None:
        tokenizer = build_tokenizer(SIZES[size][-1], seed)
    else:
        eos = [tokenizer.eos_token_id]
    config = _hf_config(arch, size, len(tokenizer), max_len, sliding_window)
    config.eos_token_id = eos[0]
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _randomize(model, seed)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=eos, pad_token_id=0)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out, **kwargs)
    tokenizer.save_pretrained(out)
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out_dir", help="folder to write the checkpoint into")
    parser.add_argument("--arch", choices=ARCHS, default="llama")
    parser.add_argument("--size", choices=tuple(SIZES), default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-len", type=int, default=2048)
    parser.add_argument("--max-shard-size", default=None, help='e.g. "200KB" for shards')
    parser.add_argument(
        "--sliding-window", type=int, default=None, help="mistral: keys each query sees"
    )


def run(args: argparse.Namespace) -> None:
    out = make_model(
        args.out_dir,
        args.arch,
        args.size,
        args.seed,
        args.max_len,
        args.max_shard_size,
        args.sliding_window,
    )
    print(f"wrote a random {args.size} {args.arch} checkpoint to {out}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="tandem make-model", description=__doc__)
    add_arguments(parser)
    run(parser.parse_args(argv))


if __name__ == "__main__":
    main()
