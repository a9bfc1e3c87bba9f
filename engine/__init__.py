"""Tandem's engine core: paged KV cache, scheduler, model runner, sampler, offline API."""

from tandem.engine.llm import LLM
from tandem.engine.llm_engine import EngineArgs, LLMEngine
from tandem.engine.outputs import CompletionOutput, RequestOutput
from tandem.engine.sampling_params import SamplingParams

__all__ = [
    "LLM",
    "CompletionOutput",
    "EngineArgs",
    "LLMEngine",
    "RequestOutput",
    "SamplingParams",
]
