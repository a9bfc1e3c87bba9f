"""From an OpenAI request to what the workers take: the prompt's token ids (chat template
applied, tokenized once, here), its block hashes, and one sampling dictionary per choice.

Every check that can fail on the client's input happens here, before any worker is asked,
and raises `InvalidRequest` naming the parameter.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from transformers import PreTrainedTokenizerBase

from tandem.engine.core.block_hash import block_extra_keys, hash_blocks
from tandem.engine.core.sampling_params import InvalidSamplingParam, SamplingParams
from tandem.engine.structured.spec import StructuredOutputsParams
from tandem.engine.tokenizer import encode_chat
from tandem.router.errors import InvalidRequest
from tandem.router.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    SamplingFields,
    TokenizeRequest,
)
from tandem.router.reasoning import ReasoningParser
from tandem.router.reasoning import reasoning_parser as make_reasoning_parser
from tandem.router.structured import StructuredOutputs, ToolUse


@dataclass(frozen=True)
class Prompt:
    """One prompt, tokenized: `text` is what `echo` repeats (None for token-id prompts).
    `block_hashes` are its full blocks' hashes for workers without a revision label; a
    labelled worker's blocks hash the revision too (`hashes_for`). `token_ids_json`: the
    ids as the JSON the decode node is sent, encoded with the rest of the preprocessing,
    off the event loop (a long prompt's ids take tens of ms to encode; None: encode them
    when sent)."""

    token_ids: list[int]
    text: str | None
    block_hashes: tuple[int, ...]
    cache_salt: str | None = None
    token_ids_json: str | None = field(default=None, compare=False, repr=False)
    _by_revision: dict[str, tuple[int, ...]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def hashes_for(self, revision: str, block_size: int) -> tuple[int, ...]:
        """The block hashes a worker of `revision` reports for this prompt (computed once
        per revision)."""
        if not revision:
            return self.block_hashes
        hashes = self._by_revision.get(revision)
        if hashes is None:
            keys = block_extra_keys(revision, self.cache_salt)
            hashes = self._by_revision[revision] = tuple(
                hash_blocks(self.token_ids, block_size, keys)
            )
        return hashes


# Prompts in one completion request (each runs `n` choices, all counted in flight).
MAX_PROMPTS = 64


@dataclass(frozen=True)
class ModelLimits:
    name: str
    vocab_size: int
    max_model_len: int
    block_size: int
    eos_token_ids: tuple[int, ...] = ()


class Preprocessor:
    """Owns the tokenizer and the structured-outputs checks (`structured`: compiled
    grammars, the tool-call parser); otherwise stateless but for a cache of single-token
    strings."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        limits: ModelLimits,
        tool_parser: str = "auto",
        reasoning_parser: str = "auto",
    ) -> None:
        self.tokenizer = tokenizer
        self.limits = limits
        self.structured = StructuredOutputs(
            tokenizer, limits.vocab_size, limits.eos_token_ids, tool_parser
        )
        self.reasoning = make_reasoning_parser(reasoning_parser, tokenizer)
        self._token_text: dict[int, str] = {}

    def reasoning_for(self, prompt: Prompt) -> ReasoningParser | None:
        """The reasoning parser for a reply to this chat prompt (None: the model does not
        reason, or the prompt turned thinking off)."""
        if self.reasoning is None:
            return None
        return self.reasoning.for_prompt(self.tokenizer.decode(prompt.token_ids[-8:]))

    # -- prompts --------------------------------------------------------------------------

    def completion_prompts(self, req: CompletionRequest) -> list[Prompt]:
        items = prompt_items(req)
        prompts = []
        for item in items:
            if isinstance(item, str):
                prompts.append(self._prompt(self.tokenizer.encode(item), item, req.cache_salt))
            else:
                prompts.append(self._prompt(list(item), None, req.cache_salt))
        return prompts

    def chat_prompt(self, req: ChatCompletionRequest, tool_use: ToolUse | None = None) -> Prompt:
        if req.functions:
            raise InvalidRequest("functions are not supported; use tools", "functions")
        tools = tool_use.tools if tool_use is not None else None
        ids = self.encode_messages(
            req.messages, req.add_generation_prompt, req.chat_template, tools,
            self.template_kwargs(req),
        )  # fmt: skip
        return self._prompt(ids, None, req.cache_salt)

    def encode_messages(
        self,
        messages: Sequence[ChatMessage],
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """The conversation (and its tools) rendered by the chat template, with extra
        arguments (`template_kwargs`), tokenized. Raises InvalidRequest."""
        if not messages:
            raise InvalidRequest("messages must not be empty", "messages")
        rendered = [template_message(m, i) for i, m in enumerate(messages)]
        try:
            return encode_chat(
                self.tokenizer, rendered, add_generation_prompt, chat_template, tools,
                template_kwargs,
            )  # fmt: skip
        except ValueError as exc:
            raise InvalidRequest(str(exc), "messages") from exc
        except Exception as exc:  # a template error is the request's fault (its messages)
            raise InvalidRequest(f"the chat template failed: {exc}", "messages") from exc

    def template_kwargs(self, req: ChatCompletionRequest | TokenizeRequest) -> dict[str, Any]:
        """The chat template's extra arguments: the request's `chat_template_kwargs`, and
        vLLM's `continue_final_message` (the reply goes on with the last assistant
        message instead of starting a turn). Raises InvalidRequest."""
        given = req.chat_template_kwargs or {}
        reserved = _RESERVED_TEMPLATE_NAMES.intersection(given)
        if reserved:
            raise InvalidRequest(
                f"chat_template_kwargs may not set {', '.join(sorted(reserved))}",
                "chat_template_kwargs",
            )
        if not req.continue_final_message:
            return dict(given)
        if req.add_generation_prompt:
            raise InvalidRequest(
                "continue_final_message needs add_generation_prompt false",
                "continue_final_message",
            )
        return {**given, "continue_final_message": True}

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def detokenize(self, token_ids: list[int]) -> str:
        self._check_ids(token_ids, "tokens")
        return self.tokenizer.decode(token_ids)

    def token_text(self, token_id: int) -> str:
        """One token on its own, as logprobs show it."""
        text = self._token_text.get(token_id)
        if text is None:
            text = self._token_text[token_id] = self.tokenizer.decode([token_id])
        return text

    def _prompt(self, token_ids: list[int], text: str | None, cache_salt: str | None) -> Prompt:
        limits = self.limits
        if not token_ids:
            raise InvalidRequest("the prompt is empty", "prompt")
        self._check_ids(token_ids, "prompt")
        if len(token_ids) >= limits.max_model_len:
            raise InvalidRequest(
                f"This model's maximum context length is {limits.max_model_len} tokens; the "
                f"prompt has {len(token_ids)} tokens, leaving no room for output",
                "prompt",
            )
        hashes = hash_blocks(token_ids, limits.block_size, block_extra_keys("", cache_salt))
        ids_json = json.dumps(token_ids, separators=(",", ":"))
        return Prompt(token_ids, text, tuple(hashes), cache_salt, ids_json)

    # -- sampling -------------------------------------------------------------------------

    def sampling_params(
        self,
        req: SamplingFields,
        max_tokens: int | None,
        logprobs: int | None,
        api_names: Mapping[str, str] = MappingProxyType({}),
    ) -> SamplingParams:
        """The request's sampling parameters, held to `SamplingParams`' own rules (the one
        place they are kept) and to this model's vocabulary. `max_tokens` None: the rest of
        the context, which `sampling` sets per prompt. `api_names`: the API's name of an
        engine field where they differ (chat's `top_logprobs` for `logprobs`). Raises
        InvalidRequest naming the API's field."""
        fields: dict[str, Any] = {
            "n": req.n,
            "max_tokens": max_tokens,
            "min_tokens": req.min_tokens,
            "stop": req.stop,
            "stop_token_ids": req.stop_token_ids or [],
            "seed": req.seed,
            "logit_bias": req.logit_bias,
            "ignore_eos": req.ignore_eos,
            "logprobs": logprobs,
            "skip_special_tokens": req.skip_special_tokens,
            "include_stop_str_in_output": req.include_stop_str_in_output,
        }
        for name in _API_DEFAULTS_NONE:
            value = getattr(req, name)
            if value is not None:  # the API's None: the engine's default
                fields[name] = value
        with _naming(api_names):
            params = SamplingParams(**fields)
            params.check_api_limits()
        self._check_ids(params.stop_token_ids, "stop_token_ids")
        self._check_ids(list(params.logit_bias or {}), "logit_bias")
        return params

    def sampling(
        self,
        params: SamplingParams,
        prompt: Prompt,
        structured: StructuredOutputsParams | None = None,
        keep_special_tokens: bool = False,
        api_names: Mapping[str, str] = MappingProxyType({}),
    ) -> list[dict[str, Any]]:
        """One sampling dictionary per choice for one prompt (`params.n` of them, each with
        `n` 1; choice i seeded `seed + i`), with the request's structured-outputs spec as
        plain data.

        `params.max_tokens` None means the rest of the context. `keep_special_tokens`
        keeps a tool parser's marker in the text. Raises InvalidRequest naming the API's
        field (`api_names` as for `sampling_params`).
        """
        room = self.limits.max_model_len - len(prompt.token_ids)
        max_tokens = params.max_tokens
        if max_tokens is not None and max_tokens > room:
            raise InvalidRequest(
                f"This model's maximum context length is {self.limits.max_model_len} tokens. "
                f"However, you requested {len(prompt.token_ids) + max_tokens} tokens "
                f"({len(prompt.token_ids)} in the prompt, {max_tokens} for the completion).",
                api_names.get("max_tokens", "max_tokens"),
            )
        with _naming(api_names):
            one = dataclasses.replace(
                params,
                n=1,
                max_tokens=room if max_tokens is None else max_tokens,
                structured_outputs=structured,
                skip_special_tokens=params.skip_special_tokens and not keep_special_tokens,
            )
        choices = []
        for i in range(params.n):
            seed = None if one.seed is None else _wrap_int64(one.seed + i)
            choices.append(dataclasses.asdict(dataclasses.replace(one, seed=seed)))
        return choices

    def _check_ids(self, token_ids: list[int], param: str) -> None:
        vocab = self.limits.vocab_size
        if token_ids and (min(token_ids) < 0 or max(token_ids) >= vocab):
            raise InvalidRequest(f"token ids must be in [0, {vocab})", param)


# What the chat template gets from the request's own fields, never from chat_template_kwargs.
_RESERVED_TEMPLATE_NAMES = frozenset(
    (
        "messages",
        "tools",
        "add_generation_prompt",
        "chat_template",
        "tokenize",
        "conversation",
        "continue_final_message",
    )
)

# The fields whose API default is None, meaning the engine's own default.
_API_DEFAULTS_NONE = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)


@contextlib.contextmanager
def _naming(api_names: Mapping[str, str]) -> Iterator[None]:
    """A `SamplingParams` rule broken inside becomes an InvalidRequest naming the API's
    field (`api_names`: the API's name of an engine field, where they differ)."""
    try:
        yield
    except InvalidSamplingParam as exc:
        raise InvalidRequest(str(exc), api_names.get(exc.param, exc.param)) from exc


def _wrap_int64(value: int) -> int:
    return (value + 2**63) % 2**64 - 2**63


def template_message(message: ChatMessage, index: int) -> dict[str, Any]:
    """A message as chat templates take it: an assistant's tool calls with their arguments
    as objects (templates write them with `tojson`), a tool result with its call's id.
    Raises InvalidRequest."""
    out: dict[str, Any] = {"role": message.role, "content": message.text()}
    if message.tool_calls:
        if message.role != "assistant":
            raise InvalidRequest("only assistant messages carry tool_calls", f"messages.{index}")
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {
                    "name": call.function.name,
                    "arguments": _arguments(call.function.arguments, index),
                },
            }
            for call in message.tool_calls
        ]
    if message.role == "tool":
        if not message.tool_call_id:
            raise InvalidRequest(
                "a tool message needs the tool_call_id it answers",
                f"messages.{index}.tool_call_id",
            )
        out["tool_call_id"] = message.tool_call_id
        if message.name:
            out["name"] = message.name
    return out


def _arguments(text: str, index: int) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidRequest(
            f"tool call arguments must be JSON: {exc}", f"messages.{index}.tool_calls"
        ) from exc


def prompt_items(req: CompletionRequest) -> Sequence[str | list[int]]:
    """The completion request's prompts, one item each (text or token ids), from the shape
    of `prompt` alone. `InvalidRequest`: none, or more than `MAX_PROMPTS`."""
    raw = req.prompt
    if isinstance(raw, str):
        items: Sequence[str | list[int]] = [raw]
    elif raw and all(isinstance(t, int) for t in raw):
        items = [raw]  # one prompt as token ids
    else:
        items = raw
    if not items:
        raise InvalidRequest("prompt must not be empty", "prompt")
    if len(items) > MAX_PROMPTS:
        raise InvalidRequest(
            f"prompt is a list of {len(items)} prompts; at most {MAX_PROMPTS} are allowed",
            "prompt",
        )
    return items
