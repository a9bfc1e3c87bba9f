"""`tandem generate`: offline generation from the command line."""

from __future__ import annotations

import argparse

from tandem.engine.llm import LLM
from tandem.engine.sampling_params import SamplingParams


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="model folder (config.json, weights)")
    parser.add_argument("prompts", nargs="+")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=None)


def run(args: argparse.Namespace) -> None:
    llm = LLM(args.model)
    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed
    )
    for output in llm.generate(args.prompts, params, use_tqdm=False):
        print(f"{output.prompt!r} -> {output.outputs[0].text!r}")
