"""Tandem against transformers on the same random checkpoints, in float32.

All prompts go in together with a token budget small enough to chunk every long prompt
and a KV pool small enough to force preemption; the greedy tokens must still be identical
(up to a near-tie, where float32 rounding may order the two best tokens either way).
"""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoModelForCausalLM

from tandem.engine import LLM, SamplingParams
from tandem.engine.tiny_model import ARCHS, make_model
from tests.engine.forward import prompt_logits
from tests.greedy import assert_greedy_agrees, logit_rounding

PROMPT_LENS = [1, 2, 17, 33, 64, 100, 180, 300]
NUM_TOKENS = 32


def hf_model(model_dir, device: str = "cpu"):
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    return model.to(device).eval()


def prompts(vocab: int, lens: list[int] = PROMPT_LENS) -> list[list[int]]:
    rng = random.Random(len(lens))
    return [[rng.randrange(5, vocab) for _ in range(n)] for n in lens]


def score_gap(scores: list[torch.Tensor]):
    """`gap_below_best` from transformers' per-step scores ([1, V] each)."""
    return lambda step, token: (scores[step][0].max() - scores[step][0, token]).item()


def assert_greedy_parity(
    model_dir, prompt_lens: list[int], num_tokens: int, num_kv_blocks: int, **llm_kwargs
) -> LLM:
    """Every prompt at once through a pool too small for all: Tandem's greedy tokens are
    transformers' on the same checkpoint and device."""
    llm = LLM(
        str(model_dir),
        dtype="float32",
        num_kv_blocks=num_kv_blocks,
        max_num_batched_tokens=64,
        max_num_seqs=8,
        **llm_kwargs,
    )
    batch = prompts(llm.engine.config.model.vocab_size, prompt_lens)
    params = SamplingParams(temperature=0, max_tokens=num_tokens, min_tokens=num_tokens)
    outputs = llm.generate(prompt_token_ids=batch, sampling_params=params, use_tqdm=False)
    assert llm.engine.scheduler.num_preemptions > 0  # the pool was too small for everyone
    assert llm.engine.check_integrity().in_use == 0

    device = llm.engine.config.device
    hf = hf_model(model_dir, device)
    for prompt, output in zip(batch, outputs):
        ids = torch.tensor([prompt], device=device)
        expected = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=num_tokens,
            min_new_tokens=num_tokens,
            output_scores=True,  # after the min-length mask: what the choice was among
            return_dict_in_generate=True,
        )
        assert_greedy_agrees(
            output.outputs[0].token_ids,
            expected.sequences[0, len(prompt) :].tolist(),
            score_gap(expected.scores),
            f"prompt of {len(prompt)} tokens",
        )
    return llm


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_tokens_identical_to_transformers(model_dirs, arch):
    assert_greedy_parity(model_dirs[arch], PROMPT_LENS, NUM_TOKENS, 40, kernels="torch")


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_greedy_tokens_through_the_triton_kernels(model_dirs, arch):
    """The Triton path (the CPU interpreter here): kernels, attention backend and the
    decode buckets' static buffers and padding; shorter, as the interpreter is slow."""
    llm = assert_greedy_parity(
        model_dirs[arch], [1, 5, 17, 40, 70], 12, 24, kernels="triton", block_size=4
    )
    assert llm.engine.runner.graphs is not None


@pytest.fixture(scope="module")
def windowed_mistral(tmp_path_factory):
    """Mistral whose queries see only their last 8 tokens (1-2 blocks of 4 or 16)."""
    return make_model(tmp_path_factory.mktemp("windowed"), arch="mistral", sliding_window=8)


@pytest.mark.parametrize("kernels", ["torch", "triton"])
def test_sliding_window_tokens_identical_to_transformers(windowed_mistral, kernels):
    """Chunked prefills over cached prefixes and decodes, all windowed, through both paths."""
    llm = assert_greedy_parity(
        windowed_mistral, [1, 9, 30, 70], 12, 24, kernels=kernels, block_size=4
    )
    assert llm.engine.config.model.sliding_window == 8


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("enforce_eager", [False, True])
def test_greedy_tokens_on_the_gpu(model_dirs, arch, enforce_eager):
    """Triton kernels and CUDA graphs (or eager) on the GPU, float32, against transformers
    on the same GPU."""
    llm = assert_greedy_parity(
        model_dirs[arch],
        PROMPT_LENS,
        NUM_TOKENS,
        40,
        device="cuda",
        dtype="float32",
        enforce_eager=enforce_eager,
    )
    assert llm.engine.config.kernels == "triton"
    assert (llm.engine.runner.graphs is None) == enforce_eager


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(
    ("device", "kernels"),
    [("cpu", "torch"), pytest.param("cuda", "triton", marks=pytest.mark.gpu)],
)
def test_one_forward_pass_logits_close(model_dirs, arch, device, kernels):
    llm = LLM(
        str(model_dirs[arch]), num_kv_blocks=32, device=device, dtype="float32", kernels=kernels
    )
    prompt = prompts(llm.engine.config.model.vocab_size)[6]  # 180 tokens, many blocks
    ours = prompt_logits(llm.engine, prompt)  # [T, V]
    with torch.inference_mode():
        theirs = hf_model(model_dirs[arch], device)(torch.tensor([prompt], device=device))
        theirs = theirs.logits[0]
    # Other kernels, summing in another order (which ones depends on the CPU): the logits
    # agree within float32 rounding of the whole model, a bound on every logit alike.
    atol = logit_rounding(len(prompt), scale=theirs.abs().max().item())
    torch.testing.assert_close(ours, theirs, rtol=0, atol=atol)
