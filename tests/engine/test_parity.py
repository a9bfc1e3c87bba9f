"""Tandem against transformers on the same random checkpoints, in float32.

All prompts go in together with a token budget small enough to chunk every long prompt
and a KV pool small enough to force preemption; the greedy tokens must still be identical.
"""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoModelForCausalLM

from tandem.engine import LLM, SamplingParams
from tandem.engine.attention import AttentionBatch
from tandem.engine.request import Request
from tandem.engine.scheduler import SchedulerOutput
from tandem.engine.tiny_model import ARCHS

PROMPT_LENS = [1, 2, 17, 33, 64, 100, 180, 300]
NUM_TOKENS = 32


def hf_model(model_dir):
    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()


def prompts(vocab: int) -> list[list[int]]:
    rng = random.Random(len(PROMPT_LENS))
    return [[rng.randrange(5, vocab) for _ in range(n)] for n in PROMPT_LENS]


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_tokens_identical_to_transformers(model_dirs, arch):
    model_dir = model_dirs[arch]
    llm = LLM(str(model_dir), num_kv_blocks=40, max_num_batched_tokens=64, max_num_seqs=8)
    batch = prompts(llm.engine.config.model.vocab_size)
    params = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, min_tokens=NUM_TOKENS)
    outputs = llm.generate(prompt_token_ids=batch, sampling_params=params, use_tqdm=False)
    assert llm.engine.scheduler.num_preemptions > 0  # the pool was too small for everyone
    assert llm.engine.check_integrity().in_use == 0

    hf = hf_model(model_dir)
    for prompt, output in zip(batch, outputs):
        ids = torch.tensor([prompt])
        expected = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=NUM_TOKENS,
            min_new_tokens=NUM_TOKENS,
        )[0, len(prompt) :].tolist()
        assert output.outputs[0].token_ids == expected, f"prompt of {len(prompt)} tokens"


@pytest.mark.parametrize("arch", ARCHS)
def test_one_forward_pass_logits_close(model_dirs, arch):
    llm = LLM(str(model_dirs[arch]), num_kv_blocks=32)
    engine = llm.engine
    prompt = prompts(engine.config.model.vocab_size)[6]  # 180 tokens, many blocks
    request = Request("logits", prompt, SamplingParams())
    assert engine.kv.allocate_slots(request, len(prompt)) is not None
    out = SchedulerOutput()
    out.add(request, len(prompt))
    runner = engine.runner
    with torch.inference_mode():
        input_ids, positions, common, _ = runner._prepare(out)
        attn = AttentionBatch(runner.backend, runner.backend.build(common))
        hidden = runner.model(input_ids, positions, runner.kv_cache, attn)
        ours = runner.model.compute_logits(hidden)  # [T, V]
        theirs = hf_model(model_dirs[arch])(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
    engine.kv.free(request)
