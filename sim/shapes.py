"""Model shapes the simulator knows by name, or reads from a `config.json`.

The shipped shapes are the public `config.json` values of the models (Meta Llama 3); only
the fields the step-time model and the KV layout need are kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tandem.engine.core.config import ModelConfig


@dataclass(frozen=True)
class ModelShape:
    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    tie_word_embeddings: bool = False

    @property
    def layer_params(self) -> int:
        """Weights of the transformer layers (the matmuls every token goes through)."""
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attn = self.hidden_size * (q + 2 * kv) + q * self.hidden_size
        return self.num_layers * (attn + 3 * self.hidden_size * self.intermediate_size)

    @property
    def num_params(self) -> int:
        embed = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        return self.layer_params + embed

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V of every layer for one token (all KV heads)."""
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * dtype_bytes

    def kv_block_bytes(self, dtype_bytes: int, block_size: int, tp: int = 1) -> int:
        """One KV block on one of `tp` ranks (its share of the KV heads, at least one: a
        head is replicated past `tp == num_kv_heads`), as
        `tandem.engine.exec.model_shard.kv_block_bytes` counts it."""
        heads = max(1, self.num_kv_heads // tp)
        return self.num_layers * 2 * heads * self.head_dim * dtype_bytes * block_size

    @classmethod
    def from_model_config(cls, name: str, m: ModelConfig) -> ModelShape:
        return cls(
            name,
            m.vocab_size,
            m.hidden_size,
            m.intermediate_size,
            m.num_layers,
            m.num_heads,
            m.num_kv_heads,
            m.head_dim,
            m.max_position_embeddings,
            m.tie_word_embeddings,
        )


# From the models' published config.json files (meta-llama on Hugging Face).
SHAPES: dict[str, ModelShape] = {
    "llama-3-8b": ModelShape("llama-3-8b", 128256, 4096, 14336, 32, 32, 8, 128, 8192),
    "llama-3-70b": ModelShape("llama-3-70b", 128256, 8192, 28672, 80, 64, 8, 128, 8192),
}


def load_shape(name_or_path: str) -> ModelShape:
    """A shipped shape by name, or the shape of a model folder (or its config.json).
    Raises ValueError for an unknown name."""
    if name_or_path in SHAPES:
        return SHAPES[name_or_path]
    path = Path(name_or_path)
    folder = path.parent if path.name == "config.json" else path
    if not (folder / "config.json").is_file():
        known = ", ".join(SHAPES)
        raise ValueError(f"unknown model {name_or_path!r}: a config.json folder or one of {known}")
    return ModelShape.from_model_config(folder.name, ModelConfig.from_pretrained(folder))
