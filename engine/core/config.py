"""Configuration: the model read from Hugging Face `config.json`, and the engine's own knobs.

Every config is a frozen dataclass validated once, where it is built; nothing downstream
re-checks it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

# HF architecture name -> the traits our one Llama-family model needs to know.
SUPPORTED_ARCHITECTURES: dict[str, dict[str, bool]] = {
    "LlamaForCausalLM": {"qkv_bias": False, "qk_norm": False},
    "MistralForCausalLM": {"qkv_bias": False, "qk_norm": False},
    "Qwen2ForCausalLM": {"qkv_bias": True, "qk_norm": False},
    "Qwen3ForCausalLM": {"qkv_bias": False, "qk_norm": True},
}

_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
}
DTYPE_CHOICES = ("auto", *_DTYPES)
DTYPE_HELP = (
    "weights, activations and KV cache (auto: the checkpoint's on a GPU; on the CPU bfloat16 "
    "where it has AVX512-BF16 or AMX, else float32)"
)


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3 style frequency-dependent rope scaling."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelConfig:
    """The shape of one Llama-family model, as read from its `config.json`."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    qk_norm: bool
    rope_scaling: RopeScaling | None = None
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: str = "float32"
    sliding_window: int = 0  # 0: every query sees its whole context

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})"
            )

    def num_parameters(self) -> int:
        """Parameter count implied by the shapes (for memory planning)."""
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attn = self.hidden_size * (q + 2 * kv) + q * self.hidden_size
        mlp = 3 * self.hidden_size * self.intermediate_size
        embed = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        return embed + self.num_layers * (attn + mlp + 2 * self.hidden_size) + self.hidden_size

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> ModelConfig:
        """Read `config.json` (and `generation_config.json` for EOS ids) from a model folder.

        Raises OSError when the folder or its config is missing, ValueError for an
        architecture Tandem does not implement.
        """
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise OSError(f"no config.json in model directory {model_dir!s}")
        raw = json.loads(path.read_text())
        gen_path = Path(model_dir) / "generation_config.json"
        gen = json.loads(gen_path.read_text()) if gen_path.is_file() else {}
        return cls.from_dict(raw, generation_config=gen)

    @classmethod
    def from_dict(
        cls, raw: dict[str, Any], generation_config: dict[str, Any] | None = None
    ) -> ModelConfig:
        archs = raw.get("architectures") or []
        arch = archs[0] if archs else None
        if arch not in SUPPORTED_ARCHITECTURES:
            supported = ", ".join(SUPPORTED_ARCHITECTURES)
            raise ValueError(f"unsupported architecture {arch!r}; Tandem supports {supported}")
        traits = SUPPORTED_ARCHITECTURES[arch]
        num_heads = raw["num_attention_heads"]
        attention_bias = bool(raw.get("attention_bias", False))
        return cls(
            architecture=arch,
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_layers=raw["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=raw.get("num_key_value_heads") or num_heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // num_heads,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=_rope_theta(raw),
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=traits["qkv_bias"] or attention_bias,
            o_bias=attention_bias and arch != "Qwen3ForCausalLM",
            qk_norm=traits["qk_norm"],
            rope_scaling=_rope_scaling(raw),
            eos_token_ids=_eos_ids(raw, generation_config or {}),
            torch_dtype=str(raw.get("torch_dtype") or raw.get("dtype") or "float32"),
            sliding_window=_sliding_window(raw),
        )


def _sliding_window(raw: dict[str, Any]) -> int:
    """Keys a query sees (itself included), or 0 when it sees its whole context: a window
    no shorter than the model's length, or one turned off (`use_sliding_window`), is none."""
    window = raw.get("sliding_window")
    if not window or not raw.get("use_sliding_window", True):
        return 0
    if int(window) >= raw.get("max_position_embeddings", 0):
        return 0
    return int(window)


def _rope_theta(raw: dict[str, Any]) -> float:
    params = raw.get("rope_parameters") or {}
    return float(raw.get("rope_theta") or params.get("rope_theta") or 10000.0)


def _rope_scaling(raw: dict[str, Any]) -> RopeScaling | None:
    scaling = raw.get("rope_scaling") or raw.get("rope_parameters")
    if not scaling:
        return None
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return None
    if kind != "llama3":
        raise ValueError(f"unsupported rope_scaling type {kind!r}; Tandem supports llama3")
    return RopeScaling(
        factor=float(scaling["factor"]),
        low_freq_factor=float(scaling["low_freq_factor"]),
        high_freq_factor=float(scaling["high_freq_factor"]),
        original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
    )


def _eos_ids(raw: dict[str, Any], gen: dict[str, Any]) -> tuple[int, ...]:
    ids: list[int] = []
    for source in (gen.get("eos_token_id"), raw.get("eos_token_id")):
        if source is None:
            continue
        for tid in source if isinstance(source, list) else [source]:
            if tid not in ids:
                ids.append(int(tid))
    return tuple(ids)


def check_tensor_parallel_size(model: ModelConfig, size: int) -> None:
    """Raise ValueError naming the dimension when `size` ranks cannot split `model`."""
    if size < 1:
        raise ValueError(f"tensor_parallel_size must be at least 1, got {size}")
    if model.num_heads % size:
        raise ValueError(
            f"tensor_parallel_size {size} does not divide the model's {model.num_heads} "
            "attention heads"
        )
    kv = model.num_kv_heads
    if (kv >= size and kv % size) or (kv < size and size % kv):
        raise ValueError(
            f"tensor_parallel_size {size} and the model's {kv} key-value heads: one must "
            "divide the other (KV heads are split, or replicated when fewer than the ranks)"
        )
    if model.intermediate_size % size:
        raise ValueError(
            f"tensor_parallel_size {size} does not divide the model's intermediate size "
            f"{model.intermediate_size}"
        )


def resolve_dtype(
    dtype: str | torch.dtype, model: ModelConfig, device: torch.device
) -> torch.dtype:
    """`auto` is the checkpoint's dtype on a GPU; on the CPU it is bfloat16 where the CPU
    computes in it natively (AVX512-BF16 or AMX: half the bytes a step reads, as vLLM
    chooses) and float32 elsewhere (emulated half precision is slower than float32)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        if device.type == "cpu":
            return torch.bfloat16 if cpu_has_bf16() else torch.float32
        return _DTYPES.get(model.torch_dtype, torch.bfloat16)
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use auto, float32, float16 or bfloat16")
    return _DTYPES[dtype]


def cpu_has_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU has bfloat16 arithmetic (the `avx512_bf16` or `amx_bf16` flag)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            return bool(flags & {"avx512_bf16", "amx_bf16"})
    return False


def resolve_device(device: str | torch.device) -> torch.device:
    """`auto` is CUDA when one is visible, else the CPU."""
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


# A prefill worker with a step due whose finished job still has a write in flight keeps
# polling that write before the step, for at most this share of its last step: the job's
# `PrefillDone` then goes out when the write lands instead of a whole step later (nothing
# polls during a step), and a slow or stuck write delays the queue by a quarter of a step
# at most. `PrefillNode` does it, and the simulator's prefill workers model it.
LAST_WRITE_WAIT_SHARE = 0.25

KERNEL_BACKENDS = ("torch", "triton")


def resolve_kernels(kernels: str, device: torch.device) -> str:
    """`auto` is Triton on CUDA and the plain-torch references elsewhere; any other name
    passes through to `EngineConfig`, which validates it."""
    if kernels == "auto":
        return "triton" if device.type == "cuda" else "torch"
    return kernels


@dataclass(frozen=True)
class CacheConfig:
    """The paged KV cache: `num_blocks` blocks of `block_size` tokens each; `hugepages`: a
    host pool on the kernel's reserved huge pages (`tandem.engine.exec.host_memory`)."""

    block_size: int = 16
    num_blocks: int = 0
    enable_prefix_caching: bool = True
    hugepages: bool = False
    # Tensor-parallel sizes of the nodes this one writes KV to: the staging mirrors they
    # need are planned with the cache (`tandem.engine.transfer.kv_staging`). Empty: our own size.
    peer_tensor_parallel_sizes: tuple[int, ...] = ()
    # Lower KV tiers (`tandem.engine.core.kv_tiers`), in blocks: host memory, and a disk
    # tier (a file under `disk_dir`) below it. 0: none.
    host_blocks: int = 0
    disk_blocks: int = 0
    disk_dir: str | None = None

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.num_blocks < 1:
            raise ValueError(f"num_kv_blocks must be at least 1, got {self.num_blocks}")
        if self.host_blocks < 0 or self.disk_blocks < 0:
            raise ValueError("KV tier sizes must not be negative")
        if self.disk_blocks and not self.host_blocks:
            raise ValueError("a disk KV tier sits under a host tier: give --kv-host-gib too")
        if self.disk_blocks and not self.disk_dir:
            raise ValueError("a disk KV tier needs a folder: give --kv-disk-dir")


@dataclass(frozen=True)
class SchedulerConfig:
    """Per-step budgets: tokens and sequences; `max_model_len` bounds prompt plus output."""

    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    max_model_len: int = 2048

    def __post_init__(self) -> None:
        for name in ("max_num_batched_tokens", "max_num_seqs", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class EngineConfig:
    """Everything one engine needs, validated together."""

    model_dir: str
    model: ModelConfig
    cache: CacheConfig
    scheduler: SchedulerConfig
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    dtype: torch.dtype = torch.float32
    seed: int = 0
    # "torch" (references) or "triton" (the kernels; CUDA, or the CPU interpreter)
    kernels: str = "torch"
    # Decode-only steps through static buffers at bucketed batch sizes, replayed from CUDA
    # graphs on a GPU (Triton kernels only).
    cuda_graphs: bool = False
    # Ranks, one process each, splitting heads, MLP and vocabulary
    # (`tandem.engine.models.tensor_parallel`).
    tensor_parallel_size: int = 1

    def __post_init__(self) -> None:
        check_tensor_parallel_size(self.model, self.tensor_parallel_size)
        for peer in self.cache.peer_tensor_parallel_sizes:
            check_tensor_parallel_size(self.model, peer)
        tp = self.tensor_parallel_size
        first = self.device.index or 0  # rank r runs on cuda:(first + r)
        if tp > 1 and self.device.type == "cuda" and first + tp > torch.cuda.device_count():
            raise ValueError(
                f"tensor_parallel_size {self.tensor_parallel_size} needs as many GPUs, but "
                f"{torch.cuda.device_count() - first} are visible from {self.device}"
            )
        if self.kernels not in KERNEL_BACKENDS:
            raise ValueError(f"unknown kernels {self.kernels!r}; use auto, torch or triton")
        if self.cuda_graphs and self.kernels != "triton":
            raise ValueError("CUDA graphs need the Triton kernels (kernels='triton')")
        if self.cache.hugepages and self.device.type != "cpu":
            raise ValueError(f"kv_hugepages is for a KV cache in host memory, not on {self.device}")
        max_len = self.scheduler.max_model_len
        if max_len > self.model.max_position_embeddings:
            raise ValueError(
                f"max_model_len ({max_len}) exceeds the model's max_position_embeddings "
                f"({self.model.max_position_embeddings})"
            )
