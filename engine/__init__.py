"""Tandem's engine: what prefill and decode share, in subpackages by concern, low to high:
`structured`, `core` (scheduling), `api`, `telemetry`, `attention`, `models`, `exec` (one
rank's execution), `transfer` (KV over NIXL), `parallel` (tensor-parallel ranks); at the top
the model runner, the engine step every node shares (`step`) and the offline API (`LLM`).
docs/architecture.md, "Packages and layers", has the table; tests/test_layers.py the rule.

The public names load on first use (PEP 562): importing a light submodule such as
`tandem.engine.api.kube_config` must not load torch and transformers.
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
