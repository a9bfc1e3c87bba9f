"""`tandem generate`: offline generation from the command line."""

from __future__ import annotations

import argparse

from tandem.engine.core.config import DTYPE_CHOICES, DTYPE_HELP
from tandem.engine.core.sampling_params import SamplingParams
from tandem.engine.llm import LLM


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="model folder (config.json, weights)")
    parser.add_argument("prompts", nargs="+")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES, help=DTYPE_HELP)
    parser.add_argument(
        "--tensor-parallel-size", type=int, default=1,
        help="ranks (processes, one GPU each on a GPU) splitting the model",
    )  # fmt: skip


def run(args: argparse.Namespace) -> None:
    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed
    )
    with LLM(args.model, dtype=args.dtype, tensor_parallel_size=args.tensor_parallel_size) as llm:
        for output in llm.generate(args.prompts, params, use_tqdm=False):
            print(f"{output.prompt!r} -> {output.outputs[0].text!r}")
