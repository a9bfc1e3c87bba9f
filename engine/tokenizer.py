"""Tokenizer loading and chat templates, through transformers' AutoTokenizer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase

Message = dict[str, Any]


def load_tokenizer(model_dir: str | Path) -> PreTrainedTokenizerBase:
    """The model folder's tokenizer. Raises OSError when the folder has none."""
    root = Path(model_dir)
    if not (root / "tokenizer.json").is_file() and not (root / "tokenizer_config.json").is_file():
        raise OSError(f"no tokenizer (tokenizer.json or tokenizer_config.json) in {root}")
    return AutoTokenizer.from_pretrained(str(root))


def encode_chat(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Message],
    add_generation_prompt: bool = True,
    chat_template: str | None = None,
    tools: Sequence[dict[str, Any]] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> list[int]:
    """Token ids of a conversation rendered by the model's chat template; `tools` (OpenAI's
    `{"type": "function", "function": {...}}` objects) are the template's to render, and
    `template_kwargs` its extra variables (say Qwen3's `enable_thinking`).

    Raises ValueError when the tokenizer has no template and none is given.
    """
    if chat_template is None and not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model's tokenizer has no chat template")
    text = tokenizer.apply_chat_template(
        list(messages),
        chat_template=chat_template,
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
        **({"tools": list(tools)} if tools else {}),
        **(template_kwargs or {}),
    )
    return tokenizer.encode(text, add_special_tokens=False)
