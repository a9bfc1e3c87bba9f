"""The offline API: `LLM(model).generate(prompts, sampling_params)`."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from tqdm.auto import tqdm

from tandem.engine.core.outputs import RequestOutput
from tandem.engine.core.sampling_params import SamplingParams
from tandem.engine.engine_args import EngineArgs
from tandem.engine.llm_engine import LLMEngine
from tandem.engine.tokenizer import Message, encode_chat

Params = SamplingParams | Sequence[SamplingParams] | None


class LLM:
    """Generate from a local Hugging Face-style model folder, all prompts batched together.

    Raises OSError for a missing folder, config or weights, ValueError for an unsupported
    architecture or invalid settings (a `tensor_parallel_size` that does not split the
    model's heads), `RankStartupError` when a tensor-parallel rank dies starting. With
    `tensor_parallel_size` N > 1 the engine runs N processes; `shutdown()` (or leaving a
    `with` block) stops and joins them, and they die with this process in any case.
    """

    def __init__(
        self,
        model: str,
        *,
        dtype: str = "auto",
        device: str = "auto",
        block_size: int = 16,
        num_kv_blocks: int | None = None,
        max_num_batched_tokens: int = 2048,
        max_num_seqs: int = 256,
        max_model_len: int | None = None,
        enable_prefix_caching: bool = True,
        seed: int = 0,
        gpu_memory_utilization: float = 0.9,
        kernels: str = "auto",
        enforce_eager: bool = False,
        kv_hugepages: bool = False,
        tensor_parallel_size: int = 1,
    ) -> None:
        args = EngineArgs(
            model=str(model),
            dtype=dtype,
            device=device,
            block_size=block_size,
            num_kv_blocks=num_kv_blocks,
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            enable_prefix_caching=enable_prefix_caching,
            seed=seed,
            gpu_memory_utilization=gpu_memory_utilization,
            kernels=kernels,
            enforce_eager=enforce_eager,
            kv_hugepages=kv_hugepages,
            tensor_parallel_size=tensor_parallel_size,
        )
        self.engine = LLMEngine.from_args(args)
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()

    def shutdown(self) -> None:
        """Stop the other tensor-parallel ranks. Idempotent."""
        self.engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def generate(
        self,
        prompts: str | Sequence[str] | None = None,
        sampling_params: Params = None,
        *,
        prompt_token_ids: Sequence[int] | Sequence[Sequence[int]] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """One `RequestOutput` per prompt, in input order. Every request is validated before
        any is queued: a ValueError leaves the engine as it was."""
        texts, token_ids = self._prompts(prompts, prompt_token_ids)
        params = _params_list(sampling_params, len(token_ids))
        for ids, p in zip(token_ids, params):
            self.engine.validate(ids, p)
        order = {}
        for i, (text, ids, p) in enumerate(zip(texts, token_ids, params)):
            request_id = str(next(self._ids))
            self.engine.add_request(request_id, ids, p, prompt=text)
            order[request_id] = i
        return self._run(order, use_tqdm)

    def chat(
        self,
        messages: Sequence[Message] | Sequence[Sequence[Message]],
        sampling_params: Params = None,
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[dict] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Generate replies to one conversation or a list of conversations, each rendered by
        the model's chat template (with `tools`, OpenAI's function objects, when given)."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        token_ids = [
            encode_chat(self.tokenizer, conv, add_generation_prompt, tools=tools)
            for conv in conversations
        ]
        return self.generate(None, sampling_params, prompt_token_ids=token_ids, use_tqdm=use_tqdm)

    def _prompts(
        self,
        prompts: str | Sequence[str] | None,
        prompt_token_ids: Sequence[int] | Sequence[Sequence[int]] | None,
    ) -> tuple[list[str | None], list[list[int]]]:
        if (prompts is None) == (prompt_token_ids is None):
            raise ValueError("give exactly one of prompts and prompt_token_ids")
        if prompts is not None:
            texts = [prompts] if isinstance(prompts, str) else list(prompts)
            if not isinstance(prompts, str | list | tuple) or not all(
                isinstance(t, str) for t in texts
            ):
                raise TypeError(
                    "prompts must be a string or a list of strings; give token ids "
                    "as prompt_token_ids="
                )
            return texts, [self.tokenizer.encode(t) for t in texts]
        ids = list(prompt_token_ids)
        if ids and isinstance(ids[0], int):
            ids = [ids]
        return [None] * len(ids), [list(map(int, x)) for x in ids]

    def _run(self, order: dict[str, int], use_tqdm: bool) -> list[RequestOutput]:
        results: list[RequestOutput | None] = [None] * len(order)
        bar = tqdm(total=len(order), desc="generating", disable=not use_tqdm)
        try:
            while self.engine.has_unfinished_requests():
                for output in self.engine.step():
                    if output.request_id in order:
                        results[order[output.request_id]] = output
                        bar.update(1)
        finally:
            bar.close()
        return [r for r in results if r is not None]


def _params_list(params: Params, count: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * count
    if isinstance(params, SamplingParams):
        return [params] * count
    params = list(params)
    if len(params) != count:
        raise ValueError(f"got {len(params)} sampling params for {count} prompts")
    return params
