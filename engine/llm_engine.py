"""The engine: requests in, one scheduled step at a time, finished outputs out.

`step()` is the engine step every node shares (`run_step`, engine/step.py: schedule, run,
update), with stop strings and the collection of finished outputs as its hook. Validation
happens in `add_request` before any state changes, so a bad request never disturbs the
others.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

from transformers import PreTrainedTokenizerBase

from tandem.engine.core.block_pool import BlockCounts
from tandem.engine.core.config import (
    EngineConfig,
)
from tandem.engine.core.kv_cache_manager import KVCacheManager
from tandem.engine.core.outputs import RequestOutput
from tandem.engine.core.request import Request, RequestStatus
from tandem.engine.core.sampling_params import SamplingParams
from tandem.engine.core.scheduler import ModelRunnerOutput, Scheduler, SchedulerOutput
from tandem.engine.engine_args import EngineArgs
from tandem.engine.model_runner import ModelRunner, attach_tiers
from tandem.engine.output_processor import OutputProcessor
from tandem.engine.step import StepHooks, run_step
from tandem.engine.structured.grammar import GrammarCompiler
from tandem.engine.tokenizer import load_tokenizer


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
        attach_tiers(self.kv, self.runner, config)
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
        hooks = _StopAndCollect(self)
        run_step(self.scheduler, lambda out: self.runner.execute(out.plan), hooks)
        return hooks.outputs

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


class _StopAndCollect(StepHooks):
    """The offline engine's part of a step: stop strings checked on the tokens just
    sampled, and the finished requests' outputs collected."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.outputs: list[RequestOutput] = []

    def after_update(
        self, out: SchedulerOutput, result: ModelRunnerOutput, finished: list[Request]
    ) -> None:
        engine = self.engine
        sampled = [r for r, t in zip(out.scheduled, result.sampled_token_ids) if t is not None]
        hits = engine.outputs.check_stop_strings(sampled)
        stopped = engine.scheduler.finish_requests(
            [r.request_id for r in hits], RequestStatus.FINISHED_STOPPED
        )
        self.outputs = engine._collect([*finished, *stopped])


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
