"""Decode buckets: sizes, the static-buffer path against the eager one, padding that writes
no KV, and the settings that turn them on and off. Capture itself needs a GPU
(`test_parity.py`'s gpu tests); here the same buffers run through the Triton interpreter."""

from __future__ import annotations

import itertools

import pytest
import torch

from tandem.engine import LLM, SamplingParams
from tandem.engine.attention.backend import AttentionBatch
from tandem.engine.core.request import Request
from tandem.engine.core.scheduler import SchedulerOutput
from tandem.engine.core.step_planner import StepPlanner
from tandem.engine.exec.cuda_graphs import MAX_GRAPH_BATCH, graph_batch_sizes

# The static and the eager step differ by float32 rounding alone: the static one runs a batch
# of 4 (one padding row) with attention planned for max_model_len, the eager one a batch of 3,
# so matmuls and attention take other kernels and sum in another order, and which ones
# depends on the CPU (and its BLAS). A float32 sum of K terms may be off by K * eps of their
# scale; each of the tiny model's 2 layers chains sums of about 350 terms (projections over
# 64 and 128, a head of 16, up to 14 keys): 2 * 350 * 1.2e-7 ≈ 8e-5 of the hidden state's
# scale. A wrong position, slot, block or padding row changes it by O(1) (checked: 1.2 to 3).
STATIC_VS_EAGER_TOL = 2 * 350 * torch.finfo(torch.float32).eps


def test_bucket_sizes():
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(5) == [1, 2, 4, 5]
    assert graph_batch_sizes(20) == [1, 2, 4, 8, 16, 20]
    sizes = graph_batch_sizes(1000)
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-1] == MAX_GRAPH_BATCH
    assert all(b - a == 8 for a, b in itertools.pairwise(sizes[3:]))


def decode_step(llm: LLM, prompt_lens: list[int]) -> SchedulerOutput:
    """Prefill all but each prompt's last token eagerly, then schedule that last token of
    each: a decode-shaped step (one query token per sequence). The runner receives the
    output's `plan`, from one planner for both steps."""
    engine = llm.engine
    planner = StepPlanner(engine.kv)
    requests = [
        Request(f"r{i}", list(range(7, 7 + n)), SamplingParams()) for i, n in enumerate(prompt_lens)
    ]
    prefill = SchedulerOutput()
    for r in requests:
        assert engine.kv.allocate_slots(r, r.num_tokens) is not None
        prefill.add(r, r.num_tokens - 1)
    engine.runner.execute(planner.plan(prefill.scheduled, prefill.num_scheduled_tokens))
    step = SchedulerOutput()
    for r, n in zip(requests, prompt_lens):
        r.num_computed_tokens = n - 1
        step.add(r, 1)
    step.plan = planner.plan(step.scheduled, step.num_scheduled_tokens)
    return step


def test_static_buffers_match_the_eager_step_and_padding_writes_nothing(llama_dir):
    llm = LLM(
        str(llama_dir),
        dtype="float32",
        num_kv_blocks=32,
        block_size=4,
        max_num_seqs=8,
        kernels="triton",
    )
    runner = llm.engine.runner
    assert runner.graphs is not None and runner.graphs.sizes == [1, 2, 4, 8]
    step = decode_step(llm, [3, 9, 14])  # 3 sequences: bucket 4, one padding row
    with torch.inference_mode():
        batch, _ = runner._prepare(step.plan)
        input_ids, positions = batch.model_inputs(runner.device)
        common = batch.attention_metadata(runner.device)
        assert runner.graphs.can_run(common)
        cache_before = runner.kv_cache.clone()
        static = runner.graphs.run(input_ids, positions, common).clone()  # [3, H]
        written = (runner.kv_cache != cache_before).flatten(2).any(-1)  # [N, L]: block touched
        slots = common.slot_mapping.tolist()
        assert set(written.any(-1).nonzero().flatten().tolist()) == {s // 4 for s in slots}
        attn = AttentionBatch(runner.backend, runner.backend.build(common))
        eager = runner.shard._forward(input_ids, positions, attn)
    assert static.shape == eager.shape == (3, llm.engine.config.model.hidden_size)
    # Relative to the whole state, not to each element: a sum's rounding scales with its
    # terms, and an element near zero is a sum of terms that cancel.
    atol = STATIC_VS_EAGER_TOL * eager.abs().max().item()
    torch.testing.assert_close(static, eager, atol=atol, rtol=0)
    for r in step.scheduled:
        llm.engine.kv.free(r)
    assert llm.engine.check_integrity().in_use == 0


def test_graphs_follow_the_settings(llama_dir):
    eager = LLM(str(llama_dir), num_kv_blocks=8, kernels="triton", enforce_eager=True)
    assert eager.engine.runner.graphs is None
    assert LLM(str(llama_dir), num_kv_blocks=8, kernels="torch").engine.runner.graphs is None
    with pytest.raises(ValueError, match="unknown kernels"):
        LLM(str(llama_dir), num_kv_blocks=8, kernels="cuda")
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        LLM(str(llama_dir), num_kv_blocks=8, gpu_memory_utilization=1.5)


def test_seeded_sampling_is_the_same_through_triton(llama_dir):
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=11, max_tokens=6, ignore_eos=True)
    prompts = [[5, 6, 7, 8, 9], [40, 41]]
    outs = []
    for kernels in ("torch", "triton"):
        llm = LLM(str(llama_dir), dtype="float32", num_kv_blocks=16, block_size=4, kernels=kernels)
        result = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
        outs.append([o.outputs[0].token_ids for o in result])
    assert outs[0] == outs[1]
