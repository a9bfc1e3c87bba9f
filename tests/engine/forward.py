"""One forward pass of one prompt through an engine's runner, for tests of the logits."""

from __future__ import annotations

import torch

from tandem.engine import SamplingParams
from tandem.engine.attention.backend import AttentionBatch
from tandem.engine.core.request import Request
from tandem.engine.core.step_planner import StepPlanner
from tandem.engine.llm_engine import LLMEngine


def prompt_logits(engine: LLMEngine, prompt: list[int]) -> torch.Tensor:
    """[T, V] float32 logits of every position of `prompt`, its blocks freed after."""
    request = Request("logits", prompt, SamplingParams())
    assert engine.kv.allocate_slots(request, len(prompt)) is not None
    plan = StepPlanner(engine.kv).plan([request], [len(prompt)])
    runner = engine.runner
    try:
        with torch.inference_mode():
            batch, _ = runner._prepare(plan)
            input_ids, positions = batch.model_inputs(runner.device)
            common = batch.attention_metadata(runner.device)
            attn = AttentionBatch(runner.backend, runner.backend.build(common))
            hidden = runner.model(input_ids, positions, runner.kv_cache, attn)
            return runner.model.compute_logits(hidden)
    finally:
        engine.kv.free(request)
