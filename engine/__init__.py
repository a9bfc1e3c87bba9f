"""Tandem's engine core: paged KV cache, scheduler, model runner, sampler, offline API.

The public names load on first use (PEP 562): importing a light submodule such as
`tandem.cli` or `tandem.engine.api.kube_config` must not load torch and transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tandem.engine.core.outputs import CompletionOutput, RequestOutput
    from tandem.engine.core.sampling_params import SamplingParams
    from tandem.engine.engine_args import EngineArgs
    from tandem.engine.llm import LLM
    from tandem.engine.llm_engine import LLMEngine

# public name -> the submodule that defines it
_EXPORTS = {
    "LLM": "tandem.engine.llm",
    "CompletionOutput": "tandem.engine.core.outputs",
    "EngineArgs": "tandem.engine.engine_args",
    "LLMEngine": "tandem.engine.llm_engine",
    "RequestOutput": "tandem.engine.core.outputs",
    "SamplingParams": "tandem.engine.core.sampling_params",
}

__all__ = [
    "LLM",
    "CompletionOutput",
    "EngineArgs",
    "LLMEngine",
    "RequestOutput",
    "SamplingParams",
]
assert set(__all__) == set(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
