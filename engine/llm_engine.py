"""The engine: requests in, one scheduled step at a time, finished outputs out.

`step()` is schedule, run, update, collect. Validation happens in `add_request` before any
state changes, so a bad request never disturbs the others.
"""

from __future__ import annotations

import dataclasses
import os
import random
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from tandem.engine.core.block_pool import BlockCounts
from tandem.engine.core.config import (
    CacheConfig,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
    resolve_device,
    resolve_dtype,
    resolve_kernels,
)
from tandem.engine.core.kv_cache_manager import KVCacheManager
from tandem.engine.core.outputs import RequestOutput
from tandem.engine.core.request import Request, RequestStatus
from tandem.engine.core.sampling_params import SamplingParams
from tandem.engine.core.scheduler import Scheduler
from tandem.engine.model_runner import ModelRunner, activation_bytes
from tandem.engine.output_processor import OutputProcessor
from tandem.engine.structured.grammar import GrammarCompiler
from tandem.engine.tokenizer import load_tokenizer
from tandem.engine.transfer.kv_staging import plan_block_bytes

# KV-cache budget on the CPU when `num_kv_blocks` is not given.
_CPU_KV_CACHE_BYTES = 2 << 30


@dataclass(frozen=True)
class EngineArgs:
    """User-facing knobs; `create_config` validates them into an `EngineConfig`."""

    model: str
    dtype: str = "auto"
    device: str = "auto"
    block_size: int = 16
    num_kv_blocks: int | None = None
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    gpu_memory_utilization: float = 0.9
    seed: int = 0
    kernels: str = "auto"
    enforce_eager: bool = False
    kv_hugepages: bool = False
    tensor_parallel_size: int = 1
    peer_tensor_parallel_sizes: tuple[int, ...] = ()  # of the nodes this one writes KV to

    def create_config(self) -> EngineConfig:
        model = ModelConfig.from_pretrained(self.model)
        device = resolve_device(self.device)
        max_model_len = self.max_model_len or model.max_position_embeddings
        scheduler = SchedulerConfig(self.max_num_batched_tokens, self.max_num_seqs, max_model_len)
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        kernels = resolve_kernels(self.kernels, device)
        probe = EngineConfig(
            self.model,
            model,
            CacheConfig(
                self.block_size,
                1,
                self.enable_prefix_caching,
                self.kv_hugepages,
                tuple(self.peer_tensor_parallel_sizes),
            ),
            scheduler,
            device,
            resolve_dtype(self.dtype, model, device),
            self.seed,
            kernels,
            kernels == "triton" and not self.enforce_eager,
            self.tensor_parallel_size,
        )
        num_blocks = self.num_kv_blocks or self._default_num_blocks(probe)
        check_kv_cache_fits(probe, num_blocks)
        return dataclasses.replace(
            probe, cache=dataclasses.replace(probe.cache, num_blocks=num_blocks)
        )

    def _default_num_blocks(self, probe: EngineConfig) -> int:
        """On a GPU, what fits in `gpu_memory_utilization` of the free memory once the
        weights and the activations of the largest step are counted; on the CPU, enough for
        every sequence at full length, capped by a fixed budget. A block costs its slot in
        every staging mirror too (`kv_staging`)."""
        block_bytes = plan_block_bytes(probe)
        if probe.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(probe.device)
            weights = probe.model.num_parameters() * probe.dtype.itemsize
            weights //= probe.tensor_parallel_size  # this rank's share, about
            budget = int(free * self.gpu_memory_utilization) - weights - activation_bytes(probe)
            if budget < block_bytes:
                raise ValueError(f"no GPU memory left for the KV cache ({free} bytes free)")
            return budget // block_bytes
        per_seq = -(-probe.scheduler.max_model_len // self.block_size)
        wanted = per_seq * probe.scheduler.max_num_seqs
        return max(1, min(wanted, _CPU_KV_CACHE_BYTES // block_bytes))


def device_memory_bytes(device: torch.device) -> int:
    """All the memory of `device`: the GPU's, or the machine's for the CPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_kv_cache_fits(config: EngineConfig, num_blocks: int) -> None:
    """Raise ValueError when `num_blocks` blocks exceed the device's whole memory, before
    the block pool (one Python object per block) or the tensor is built."""
    need, have = num_blocks * plan_block_bytes(config), device_memory_bytes(config.device)
    if need > have:
        raise ValueError(
            f"num_kv_blocks={num_blocks}: a KV cache of {need / 2**30:.1f} GiB does not fit "
            f"in the {have / 2**30:.1f} GiB of {config.device}"
        )


class LLMEngine:
    """Owns the scheduler, the KV-cache manager, the model runner, the outputs and the
    compiled grammars (structured outputs)."""

    def __init__(
        self, config: EngineConfig, tokenizer: PreTrainedTokenizerBase | None = None
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.kv = KVCacheManager(
            config.cache.block_size, config.cache.num_blocks, config.cache.enable_prefix_caching
        )
        self.scheduler = Scheduler(config.scheduler, self.kv)
        self.runner = ModelRunner(config)
        self.outputs = OutputProcessor(tokenizer)
        self.grammars = grammar_compiler(config, tokenizer)
        self._seeds = random.Random(config.seed)

    @classmethod
    def from_args(cls, args: EngineArgs) -> LLMEngine:
        config = args.create_config()
        return cls(config, load_tokenizer(config.model_dir))

    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise ValueError if this request can never be served (an `InvalidGrammar` for
        structured outputs that do not compile). Changes nothing but the grammar cache."""
        validate_prompt(self.config, prompt_token_ids, params)
        if params.structured_outputs is not None:
            self.grammars.validate(params.structured_outputs)

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        prompt: str | None = None,
        cache_salt: str | None = None,
    ) -> None:
        """Validate, then queue `params.n` copies of the request. Raises ValueError for an
        invalid request or an id already in use, with no state changed."""
        if request_id in self.outputs.parent_ids():
            raise ValueError(f"request id {request_id!r} is already in use")
        self.validate(prompt_token_ids, params)
        children = [
            self._make_request(
                request_id if params.n == 1 else f"{request_id}#{i}",
                prompt_token_ids,
                _child_params(params, i),
                cache_salt,
            )
            for i in range(params.n)
        ]
        # A copy's id ("a#1") may be another request's own id, or the reverse.
        for child in children:
            if child.request_id in self.scheduler.requests:
                raise ValueError(f"request id {child.request_id!r} is already in use")
        self.outputs.add(request_id, prompt, children)
        for child in children:
            self.scheduler.add_request(child)

    def _make_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        cache_salt: str | None,
    ) -> Request:
        request = Request(
            request_id, prompt_token_ids, params, self.config.model.eos_token_ids, cache_salt
        )
        request.seed = params.seed if params.seed is not None else self._seeds.getrandbits(63)
        if params.structured_outputs is not None:
            request.grammar = self.grammars.matcher(params.structured_outputs)
        return request

    def abort_request(self, request_ids: Iterable[str]) -> list[RequestOutput]:
        """Abort requests (by the id given to `add_request`) wherever they are; their blocks
        are freed now. Returns their outputs, finish reason "abort"."""
        child_ids = [c for rid in request_ids for c in self.outputs.children_of(rid)]
        finished = self.scheduler.finish_requests(child_ids, RequestStatus.FINISHED_ABORTED)
        return self._collect(finished)

    def step(self) -> list[RequestOutput]:
        """Run one scheduled step; return the requests that finished in it."""
        scheduler_output = self.scheduler.schedule()
        if scheduler_output.is_empty:
            return []
        result = self.runner.execute(scheduler_output.plan)
        finished = self.scheduler.update_from_output(scheduler_output, result)
        sampled = [
            r for r, t in zip(scheduler_output.scheduled, result.sampled_token_ids) if t is not None
        ]
        hits = self.outputs.check_stop_strings(sampled)
        finished += self.scheduler.finish_requests(
            [r.request_id for r in hits], RequestStatus.FINISHED_STOPPED
        )
        return self._collect(finished)

    def _collect(self, finished: list[Request]) -> list[RequestOutput]:
        outputs = []
        for request in finished:
            output = self.outputs.finish(request)
            if output is not None:
                outputs.append(output)
        return outputs

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def shutdown(self) -> None:
        """Stop and join the other tensor-parallel ranks (nothing at one rank). The engine
        cannot step afterwards. Idempotent."""
        self.runner.close()

    def check_integrity(self) -> BlockCounts:
        """Assert the KV-cache invariants (see `KVCacheManager.check_integrity`)."""
        return self.kv.check_integrity()


def grammar_compiler(
    config: EngineConfig, tokenizer: PreTrainedTokenizerBase | None
) -> GrammarCompiler:
    """The engine's grammar compiler: the model's vocabulary (the logits' width, which may
    exceed the tokenizer's) and its end-of-sequence tokens."""
    return GrammarCompiler(tokenizer, config.model.vocab_size, config.model.eos_token_ids)


def validate_prompt(
    config: EngineConfig, prompt_token_ids: list[int], params: SamplingParams
) -> None:
    """Raise ValueError if a request with this prompt can never be served by `config`."""
    num_prompt = len(prompt_token_ids)
    max_len = config.scheduler.max_model_len
    vocab = config.model.vocab_size
    if num_prompt == 0:
        raise ValueError("the prompt is empty")
    if num_prompt > max_len:
        raise ValueError(f"the prompt has {num_prompt} tokens, more than max_model_len ({max_len})")
    if min(prompt_token_ids) < 0 or max(prompt_token_ids) >= vocab:
        raise ValueError(f"prompt token ids must be in [0, {vocab})")
    longest = min(max_len, num_prompt + (params.max_tokens or max_len))
    needed = -(-longest // config.cache.block_size)
    if needed > config.cache.num_blocks:
        raise ValueError(
            f"a sequence of {longest} tokens needs {needed} KV blocks but the cache has only "
            f"{config.cache.num_blocks}"
        )


def _child_params(params: SamplingParams, index: int) -> SamplingParams:
    """Copy `index` of an n > 1 request: one sequence, its own seed when one is given."""
    if params.n == 1:
        return params
    seed = None if params.seed is None else params.seed + index
    return SamplingParams(**{**vars(params), "n": 1, "seed": seed})
