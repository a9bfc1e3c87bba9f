"""Structured outputs: what the grammar costs a decode step, and what compiling one costs.

1. Decode step time at each `--batch` with and without a JSON-schema grammar on every
   request (a schema whose instances are long, so no request completes while timed; the
   two engines' steps interleaved), and the grammar's parts of it: the mask (llguidance
   filling the bitmask, the mask added to the logits) and the matchers advancing.
   On a random checkpoint of `--size`, with the vocabulary of `--tokenizer` (default: the
   tiny one trained here; the mask's cost grows with the vocabulary, so give a real one).
2. Grammar compile time for a few real schemas, cold and cached, and per-token mask cost
   along a valid instance (one sequence, then 64 at once), with llguidance (what Tandem
   uses) and, when it is installed, xgrammar.

    python -P bench/structured.py [--tokenizer DIR] [--size small] [--batch 1 64]
                                  [--steps 20] [--threads 1] [--no-libraries] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe_host

from tandem.engine.core.sampling_params import SamplingParams
from tandem.engine.engine_args import EngineArgs
from tandem.engine.exec.grammar_mask import GrammarMask
from tandem.engine.llm_engine import LLMEngine
from tandem.engine.structured.bitmask import BitmaskFiller
from tandem.engine.structured.grammar import Grammar
from tandem.engine.structured.spec import StructuredOutputsParams
from tandem.engine.tiny_model import make_model

ITEM = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "id": {"type": "integer", "minimum": 0, "maximum": 100000},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"enum": ["new", "vip", "late"]}, "maxItems": 3},
        "score": {"type": "number", "minimum": 0, "maximum": 1},
    },
    "required": ["name", "id", "tags"],
    "additionalProperties": False,
}
# Long instances only: no request finishes while the steps are timed.
LONG = {"type": "object", "properties": {"rows": {"type": "array", "items": ITEM,
        "minItems": 200}}, "required": ["rows"], "additionalProperties": False}  # fmt: skip
SCHEMAS = {
    "tool: get_weather": {
        "type": "object",
        "properties": {
            "location": {"type": "string", "description": "City and country"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["location", "unit"],
        "additionalProperties": False,
    },
    "record (5 fields)": ITEM,
    "order (nested, $defs)": {
        "$defs": {
            "line": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                    "qty": {"type": "integer", "minimum": 1},
                    "price": {"type": "number"},
                },
                "required": ["sku", "qty", "price"],
                "additionalProperties": False,
            }
        },
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "lines": {"type": "array", "items": {"$ref": "#/$defs/line"}, "minItems": 1},
            "status": {"enum": ["open", "paid", "shipped"]},
            "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        },
        "required": ["id", "lines", "status", "note"],
        "additionalProperties": False,
    },
}
INSTANCES = {
    "tool: get_weather": {"location": "San Francisco, US", "unit": "celsius"},
    "record (5 fields)": {"name": "Ada", "id": 1815, "email": "ada@example.com",
                          "tags": ["vip", "new"], "score": 0.75},
    "order (nested, $defs)": {"id": "A-17", "lines": [{"sku": "ABC-1234", "qty": 2,
                              "price": 3.5}, {"sku": "XYZ-0001", "qty": 1, "price": 10}],
                              "status": "paid", "note": None},
}  # fmt: skip


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    print("command:", "python -P bench/structured.py", *sys.argv[1:])
    print(f"machine: {describe_host()}, torch {torch.__version__}, "
          f"{args.threads} torch thread(s)")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer) if args.tokenizer else None
        model = make_model(Path(tmp) / "m", size=args.size, tokenizer=tokenizer)
        tokenizer = AutoTokenizer.from_pretrained(model)
        print(f"model: random {args.size} llama, vocabulary {len(tokenizer)}")
        decode_steps(model, args)
        if args.libraries:
            compare_libraries(tokenizer, len(tokenizer))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer", default=None, help="a folder with a real tokenizer")
    parser.add_argument("--size", default="small", choices=("tiny", "small"))
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--steps", type=int, default=20, help="timed decode steps per run")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-libraries", dest="libraries", action="store_false")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes: the code runs")
    args = parser.parse_args()
    if args.smoke:
        args.size, args.batch, args.steps = "tiny", [1, 4], 2
    return args


# -- 1. decode steps ----------------------------------------------------------------------


class GrammarTimer:
    """Wraps `BitmaskFiller.fill` and `GrammarMask.apply` (the mask: filled when the step is
    planned, added to the logits when it runs) and `Grammar.accept` (a matcher advancing past
    a token) to add up the seconds each takes."""

    def __init__(self) -> None:
        self.mask = self.advance = 0.0
        self._fill, self._apply = BitmaskFiller.fill, GrammarMask.apply
        self._accept = Grammar.accept

    def __enter__(self) -> GrammarTimer:
        timer = self

        def fill(filler, grammars):
            start = time.perf_counter()
            bitmask = timer._fill(filler, grammars)
            timer.mask += time.perf_counter() - start
            return bitmask

        def apply(mask, logits, rows, bits):
            start = time.perf_counter()
            timer._apply(mask, logits, rows, bits)
            timer.mask += time.perf_counter() - start

        def accept(grammar, token_id):
            start = time.perf_counter()
            accepted = timer._accept(grammar, token_id)
            timer.advance += time.perf_counter() - start
            return accepted

        BitmaskFiller.fill, GrammarMask.apply, Grammar.accept = fill, apply, accept
        return self

    def __exit__(self, *exc) -> None:
        BitmaskFiller.fill, GrammarMask.apply = self._fill, self._apply
        Grammar.accept = self._accept


def decode_steps(model: Path, args: argparse.Namespace) -> None:
    """Two engines on the same model, one batch each (plain, and under a grammar), their
    steps interleaved so that whatever else the machine does weighs on both alike."""
    print(f"\ndecode step (ms, median of {args.steps} steps of each, interleaved)")
    print(f"{'batch':>6} {'plain':>9} {'grammar':>9} {'mask':>7} {'advance':>8} {'overhead':>9}")
    engine_args = EngineArgs(str(model), max_num_seqs=max(args.batch), num_kv_blocks=2048)
    engines = [LLMEngine.from_args(engine_args) for _ in range(2)]
    for batch in args.batch:
        fill(engines[0], batch, None, args.steps)
        fill(engines[1], batch, StructuredOutputsParams(json=LONG), args.steps)
        plain, shaped, masks, advances = [], [], [], []
        for _ in range(args.steps):
            plain.append(timed_step(engines[0]))
            with GrammarTimer() as timer:
                shaped.append(timed_step(engines[1]))
            masks.append(timer.mask)
            advances.append(timer.advance)
        for engine in engines:
            assert len(engine.scheduler.running) == batch, "a request finished while timed"
            engine.abort_request(list(engine.outputs.parent_ids()))
        p, g = statistics.median(plain), statistics.median(shaped)
        m, a = statistics.median(masks), statistics.median(advances)
        print(f"{batch:>6} {p * 1e3:>9.2f} {g * 1e3:>9.2f} {m * 1e3:>7.2f} {a * 1e3:>8.2f} "
              f"{(g - p) / p:>9.1%}")  # fmt: skip


def fill(engine: LLMEngine, batch: int, spec, steps: int) -> None:
    """`batch` requests, stepped until every one decodes."""
    for i in range(batch):
        params = SamplingParams(max_tokens=steps + 64, ignore_eos=True, seed=i,
                                structured_outputs=spec)  # fmt: skip
        engine.add_request(f"b{batch}-{i}", [5 + i % 50] * 16, params)
    while any(r.num_output_tokens == 0 for r in engine.scheduler.requests.values()):
        engine.step()


def timed_step(engine: LLMEngine) -> float:
    start = time.perf_counter()
    engine.step()
    return time.perf_counter() - start


# -- 2. the libraries ---------------------------------------------------------------------


def compare_libraries(tokenizer, vocab: int) -> None:
    print("\ngrammar compile (ms) and mask per token (us; 64 sequences at once: ms)")
    print(f"{'library':<11} {'schema':<22} {'compile':>8} {'cached':>7} {'mask':>6} "
          f"{'p90':>6} {'64 seqs':>8}")  # fmt: skip
    for name, library in (("llguidance", Llguidance), ("xgrammar", Xgrammar)):
        try:
            lib = library(tokenizer, vocab)
        except ImportError:
            print(f"{name:<11} (not installed: pip install {name})")
            continue
        for schema_name, schema in SCHEMAS.items():
            compile_s, cached_s = lib.compile_times(schema)
            text = lib.instance_text(INSTANCES[schema_name])
            ids = tokenizer.encode(text, add_special_tokens=False)
            one, p90, batch = lib.mask_times(schema, ids)
            print(f"{name:<11} {schema_name:<22} {compile_s * 1e3:>8.2f} {cached_s * 1e3:>7.3f} "
                  f"{one * 1e6:>6.0f} {p90 * 1e6:>6.0f} {batch * 1e3:>8.2f}")  # fmt: skip


class Llguidance:
    def __init__(self, tokenizer, vocab: int) -> None:
        import llguidance
        import llguidance.hf

        self.ll = llguidance
        start = time.perf_counter()
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab)
        print(f"llguidance tokenizer: {(time.perf_counter() - start) * 1e3:.0f} ms (once)")
        self.words = (vocab + 31) // 32
        self.executor = llguidance.LLExecutor()

    def instance_text(self, instance) -> str:
        return json.dumps(instance, separators=(",", ":"))

    def _grammar(self, schema) -> str:
        options = {"whitespace_flexible": False}
        return self.ll.LLMatcher.grammar_from_json_schema(schema, defaults=options)

    def compile_times(self, schema) -> tuple[float, float]:
        grammar = self._grammar(schema)
        start = time.perf_counter()
        matcher = self.ll.LLMatcher(self.tokenizer, grammar)
        cold = time.perf_counter() - start
        start = time.perf_counter()
        matcher.deep_copy()  # what a cached grammar costs a request
        return cold, time.perf_counter() - start

    def mask_times(self, schema, ids) -> tuple[float, float, float]:
        grammar = self._grammar(schema)
        one = self.ll.LLMatcher(self.tokenizer, grammar)
        many = [self.ll.LLMatcher(self.tokenizer, grammar) for _ in range(64)]
        bits = torch.empty(64, self.words, dtype=torch.int32)
        singles, batches = [], []
        for token in ids:
            start = time.perf_counter()
            one.unsafe_compute_mask_ptr(bits.data_ptr(), self.words * 4)
            singles.append(time.perf_counter() - start)
            start = time.perf_counter()
            pairs = [(m, i) for i, m in enumerate(many)]
            self.executor.unsafe_compute_mask_ptr(pairs, bits.data_ptr(), self.words * 4, 64)
            batches.append(time.perf_counter() - start)
            assert one.consume_token(token) and all(m.consume_token(token) for m in many)
        return _stats(singles, batches)


class Xgrammar:
    def __init__(self, tokenizer, vocab: int) -> None:
        import xgrammar

        self.xgr = xgrammar
        start = time.perf_counter()
        self.info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab)
        print(f"xgrammar tokenizer: {(time.perf_counter() - start) * 1e3:.0f} ms (once)")
        self.vocab = vocab

    def instance_text(self, instance) -> str:
        return json.dumps(instance)  # xgrammar's strict JSON puts a blank after , and :

    def _compile(self, schema, cache: bool):
        compiler = self.xgr.GrammarCompiler(self.info, max_threads=os.cpu_count(),
                                            cache_enabled=cache)  # fmt: skip
        return compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)

    def compile_times(self, schema) -> tuple[float, float]:
        start = time.perf_counter()
        compiled = self._compile(schema, cache=False)
        cold = time.perf_counter() - start
        start = time.perf_counter()
        self.xgr.GrammarMatcher(compiled)  # what a cached grammar costs a request
        return cold, time.perf_counter() - start

    def mask_times(self, schema, ids) -> tuple[float, float, float]:
        compiled = self._compile(schema, cache=True)
        one = self.xgr.GrammarMatcher(compiled)
        many = [self.xgr.GrammarMatcher(compiled) for _ in range(64)]
        bits = self.xgr.allocate_token_bitmask(64, self.vocab)
        batch_matcher = self.xgr.BatchGrammarMatcher(max_threads=os.cpu_count())
        singles, batches = [], []
        for token in ids:
            start = time.perf_counter()
            one.fill_next_token_bitmask(bits, 0)
            singles.append(time.perf_counter() - start)
            start = time.perf_counter()
            batch_matcher.batch_fill_next_token_bitmask(many, bits)
            batches.append(time.perf_counter() - start)
            assert one.accept_token(token) and all(m.accept_token(token) for m in many)
        return _stats(singles, batches)


def _stats(singles: list[float], batches: list[float]) -> tuple[float, float, float]:
    ordered = sorted(singles)
    p90 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]
    return statistics.median(singles), p90, statistics.median(batches)


if __name__ == "__main__":
    main()
