"""A structured-outputs spec that applies only after the reasoning, as vLLM's do: the
reasoning is free text up to `</think>`, then blanks, then the answer under the request's
own grammar (a schema, a regex, a tool call in the model's format...).

It is one llguidance Lark grammar, so the nodes enforce it as they enforce any other and
need no notion of reasoning: the router wraps the spec before it is sent. The answer is
nested whole (`%json` for a schema, `%lark {...}` for the rest), so its own rules and
`%ignore`s stay its own. Where the vocabulary has `</think>` as one added token (Qwen3,
DeepSeek-R1), the grammar names that token, and the reasoning is any tokens but it and
end-of-sequence (special ones too), after an optional `<think>` token; where the tag is
plain text, the reasoning is one lexeme that ends at the first `</think>`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from tandem.engine.structured.grammar import grammar_text
from tandem.engine.structured.spec import StructuredOutputsParams
from tandem.router.reasoning import END, START

_BLANKS = r"/[ \t\n]*/"


def after_reasoning(
    spec: StructuredOutputsParams,
    tokenizer: PreTrainedTokenizerBase,
    eos_token_ids: Sequence[int] = (),
) -> StructuredOutputsParams:
    """`spec` enforced only once the reasoning has ended; the end-of-sequence tokens are
    not allowed in the reasoning (the answer must come). Raises InvalidGrammar for a spec
    llguidance cannot read."""
    rules = _reasoning_rules(tokenizer, eos_token_ids)
    return StructuredOutputsParams(grammar=rules + _answer_rule(spec))


def _reasoning_rules(tokenizer: PreTrainedTokenizerBase, eos_token_ids: Sequence[int]) -> str:
    end = _token(tokenizer, END)
    if end is None:  # plain text: the reasoning ends at the first `</think>`
        return (
            f"start: THINK {_BLANKS} answer\n"
            r"THINK: /(?s:.*)<\/think>/ & ~/(?s:.*<\/think>.+)/" + "\n"
        )
    start = _token(tokenizer, START)
    opening = f"<[{start}]>? " if start is not None else ""
    # any token but the end and end-of-sequence, special ones too (a reasoning may
    # mention `<tool_call>`)
    barred = ",".join(str(t) for t in sorted({end, *eos_token_ids}))
    return f"start: {opening}think <[{end}]> {_BLANKS} answer\nthink: <[^{barred}]>*\n"


def _answer_rule(spec: StructuredOutputsParams) -> str:
    text = grammar_text(spec)
    try:
        (entry,) = json.loads(text)["grammars"]  # a schema or a regex: llguidance's JSON form
    except ValueError:
        return f"answer: %lark {{\n{text}\n}}\n"  # a Lark grammar
    if entry.get("json_schema") is not None:
        return f"answer: %json {json.dumps(entry['json_schema'])}\n"
    return f"answer: %lark {{\n{entry['lark_grammar']}\n}}\n"


def _token(tokenizer: PreTrainedTokenizerBase, text: str) -> int | None:
    """The id of `text` when the vocabulary has it as one added token."""
    return tokenizer.get_added_vocab().get(text)
