"""Structured outputs across the prefill/decode split, with real node processes: the
prefill node samples the first token under the grammar, the decode node's matcher starts
from the prompt and advances with that token; the result is the one a decode node that
prefills locally gives, and the offline engine's."""

from __future__ import annotations

import json
import random

import jsonschema

from tandem.engine import SamplingParams
from tests.disagg.nodes import assert_clean, connect, generate

SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "pattern": "^[a-z]{2}-[0-9]{3}$"},
        "score": {"type": "integer", "minimum": -20, "maximum": 20},
        "tags": {"type": "array", "items": {"enum": ["x", "y", "zz"]}, "maxItems": 3},
    },
    "required": ["id", "score"],
    "additionalProperties": False,
}


def items(seed: int, count: int) -> list[tuple[list[int], dict]]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        prompt = [rng.randrange(5, 500) for _ in range(rng.choice([3, 16, 17, 40, 90]))]
        spec = {"json": SCHEMA} if i % 2 else {"regex": "[a-c]{1,8}(-[0-9]{2})?"}
        sampling = {"max_tokens": 120, "seed": 1000 + i, "structured_outputs": spec}
        out.append((prompt, sampling))
    return out


def test_remote_and_local_prefill_give_identical_grammar_outputs(cluster, llm):
    """Seeded draws, compared exactly: one flips only where the two best of its random race
    are within float32 rounding of each other (see test_disagg.assert_matches_offline)."""
    d, p1 = cluster["d"], cluster["p1"]
    connect(d, p1)
    work = items(7, 8)
    remote = [generate(d, f"so-r{i}", p, s, p1) for i, (p, s) in enumerate(work)]
    local = [generate(d, f"so-l{i}", p, s) for i, (p, s) in enumerate(work)]
    offline = llm.generate(
        prompt_token_ids=[p for p, _ in work],
        sampling_params=[SamplingParams(**s) for _, s in work],
        use_tqdm=False,
    )
    for (tokens, text, last), (l_tokens, _, _), out, (_, sampling) in zip(
        remote, local, offline, work
    ):
        assert tokens == l_tokens == out.outputs[0].token_ids, sampling
        assert last["finish_reason"] == "stop" and not last.get("error"), last
        if "json" in sampling["structured_outputs"]:
            jsonschema.validate(json.loads(text), SCHEMA)
    assert_clean(d, p1)


def test_a_bad_spec_is_refused_by_the_decode_node(cluster):
    d, p1 = cluster["d"], cluster["p1"]
    for spec in ({"regex": "a(b"}, {"json": {"type": "array", "uniqueItems": True}}, {"jsn": {}}):
        _, _, reply = generate(d, "so-bad", [5, 6, 7], {"structured_outputs": spec}, p1)
        assert reply["status"] == 400, reply
    assert_clean(d, p1)
