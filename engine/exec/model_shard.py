"""One rank's part of the model: its weight slices, its KV cache over its own KV heads (the
same block ids on every rank), and one step's forward over a `StepBatch`.

At one rank this is the whole model; with tensor parallelism every rank holds one, rank 0
in the engine's process and the others in `tandem.engine.parallel.rank_main`, and each runs every
step (the collectives inside the forward keep them in step).
"""

from __future__ import annotations

import torch

from tandem.engine.attention.backend import AttentionBackend, AttentionBatch
from tandem.engine.attention.torch_backend import TorchAttentionBackend
from tandem.engine.core.config import EngineConfig
from tandem.engine.exec.cuda_graphs import DecodeGraphs
from tandem.engine.exec.host_memory import hugepage_zeros
from tandem.engine.exec.loader import load_weights
from tandem.engine.exec.step_batch import StepBatch
from tandem.engine.models.prepacked import can_prepack, prepack_linears
from tandem.engine.models.registry import model_class
from tandem.engine.models.tensor_parallel import RankShape, TensorParallel
from tandem.kernels.attention_plan import device_num_sms
from tandem.kernels.ops import kernel_ops


def rank_num_kv_heads(config: EngineConfig) -> int:
    """KV heads each rank caches (all of them at one rank)."""
    return RankShape.of(config.model, 0, config.tensor_parallel_size).num_kv_heads


def select_attention_backend(config: EngineConfig) -> AttentionBackend:
    """The plain-torch backend with the torch kernels; Triton's with the Triton kernels."""
    m = config.model
    shape = RankShape.of(m, 0, config.tensor_parallel_size)
    if config.kernels == "torch":
        return TorchAttentionBackend(
            config.cache.block_size,
            sliding_window=m.sliding_window,
            dtype=config.dtype,
            num_heads=shape.num_heads,
        )
    from tandem.engine.attention.triton_backend import TritonAttentionBackend

    return TritonAttentionBackend(
        shape.num_kv_heads,
        shape.num_heads // shape.num_kv_heads,
        device_num_sms(config.device),
        sliding_window=m.sliding_window,
        dtype=config.dtype,
    )


def allocate_kv_cache(config: EngineConfig) -> torch.Tensor:
    """The block-major cache over this rank's KV heads:
    [num_blocks, num_layers, 2, block_size, rank's num_kv_heads, head_dim]."""
    m = config.model
    shape = (
        config.cache.num_blocks,
        m.num_layers,
        2,
        config.cache.block_size,
        rank_num_kv_heads(config),
        m.head_dim,
    )
    if config.cache.hugepages:
        return hugepage_zeros(shape, config.dtype)
    return torch.zeros(shape, dtype=config.dtype, device=config.device)


def kv_block_bytes(config: EngineConfig) -> int:
    """Bytes of one KV block on one rank (every layer's K and V of its KV heads for
    `block_size` tokens)."""
    m = config.model
    elem = torch.empty((), dtype=config.dtype).element_size()
    heads = rank_num_kv_heads(config)
    return m.num_layers * 2 * config.cache.block_size * heads * m.head_dim * elem


class ModelShard:
    """Owns this rank's weights, KV cache, attention backend and decode graphs."""

    def __init__(self, config: EngineConfig, tp: TensorParallel) -> None:
        """Builds the model and loads this rank's slices; no collective runs until
        `capture_graphs` or `forward` (so a group need not exist yet)."""
        self.config = config
        self.tp = tp
        self.device = config.device
        ops = kernel_ops(config.kernels)
        with torch.device(config.device):
            self.model = model_class(config.model)(config.model, ops, tp).to(config.dtype)
        load_weights(self.model, config.model_dir)
        self.model.eval()
        if can_prepack(config.device, config.dtype):
            prepack_linears(self.model)
        self.kv_cache = allocate_kv_cache(config)
        self.backend = select_attention_backend(config)
        self.graphs: DecodeGraphs | None = None

    def capture_graphs(self) -> None:
        """Decode graphs, when configured; every rank captures together (the graphs hold
        the all-reduces)."""
        if not self.config.cuda_graphs:
            return
        c = self.config
        self.graphs = DecodeGraphs(
            self._forward,
            self.backend,
            c.scheduler.max_num_seqs,
            -(-c.scheduler.max_model_len // c.cache.block_size) + 1,  # + the next step's block
            c.scheduler.max_model_len,
            self.device,
        )
        with torch.inference_mode():
            self.graphs.capture()

    def _forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBatch
    ) -> torch.Tensor:  # [T] ids, [T] positions -> [T, H]
        return self.model(input_ids, positions, self.kv_cache, attn)

    @torch.inference_mode()
    def forward(self, batch: StepBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run one step: (hidden [T, H], logits [S, V] float32 of `batch.logits_indices`).
        Logits are None on ranks other than 0, and when no sequence samples."""
        input_ids, positions = batch.model_inputs(self.device)
        common = batch.attention_metadata(self.device)
        if self.graphs is not None and self.graphs.can_run(common):
            hidden = self.graphs.run(input_ids, positions, common)  # [T, H]
        else:
            attn = AttentionBatch(self.backend, self.backend.build(common))
            hidden = self._forward(input_ids, positions, attn)  # [T, H]
        if not batch.sample_rows:
            return hidden, None
        rows = torch.from_numpy(batch.logits_indices).to(self.device)
        return hidden, self.model.compute_logits(hidden[rows])  # [S, V]
