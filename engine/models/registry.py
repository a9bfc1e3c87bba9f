"""Architecture name (from `config.json`) -> model class."""

from __future__ import annotations

from torch import nn

from tandem.engine.core.config import SUPPORTED_ARCHITECTURES, ModelConfig
from tandem.engine.models.llama import LlamaForCausalLM

_MODELS: dict[str, type[nn.Module]] = {arch: LlamaForCausalLM for arch in SUPPORTED_ARCHITECTURES}


def model_class(config: ModelConfig) -> type[nn.Module]:
    """Raises ValueError for an architecture with no implementation."""
    try:
        return _MODELS[config.architecture]
    except KeyError:
        raise ValueError(f"no model implementation for {config.architecture!r}") from None
