"""Calibrate the simulator's step-time model on this machine: run the real engine on a
mixed workload, time every step (`LLMEngine.step`, as a node's loop runs it), fit a device profile
(`tandem.sim.calibration`) and write it as JSON.

    OMP_NUM_THREADS=1 python -P bench/calibrate.py --out sim/profiles/cpu.json
    python -P bench/calibrate.py --smoke

The KV-link constants are not measured here: they are this machine's `bench/transfer.py`
figures (docs/performance.md), NIXL over UCX `cma` on default pages. Nor are the KV tiers'
links: they are kept from the shipped sim/profiles/cpu.json (`bench/kv_tiers.py
--copy-probe`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe_host

from tandem.engine.core.sampling_params import SamplingParams
from tandem.engine.engine_args import EngineArgs
from tandem.engine.llm_engine import LLMEngine
from tandem.engine.tiny_model import make_model
from tandem.sim.calibration import fit_profile
from tandem.sim.node import step_shape
from tandem.sim.profiles import PROFILE_DIR, DeviceProfile, load_profile
from tandem.sim.shapes import load_shape
from tandem.sim.step_model import StepShape
from tandem.sim.transfer_profile import load_transfer_profile

WAVES = (1, 2, 4, 8, 16, 32)  # requests added together: the batch sizes a run goes through


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default=None, help="model folder (default: make-model --size small)")
    p.add_argument("--threads", type=int, default=1, help="torch threads, as a node's --threads")
    p.add_argument("--max-prompt", type=int, default=480)
    p.add_argument("--max-output", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--rounds", type=int, default=3, help="timed passes over the waves")
    p.add_argument("--network-latency-ms", type=float, default=0.5, help="one hop, assumed")
    p.add_argument(
        "--transfer-profile",
        default=str(PROFILE_DIR / "transfer" / "cpu.json"),
        help="KV-link constants (bench/transfer.py --profile-out)",
    )
    p.add_argument("--out", default=None, help="write the profile here")
    p.add_argument("--smoke", action="store_true", help="tiny model, few steps")
    return p.parse_args()


def timed_steps(engine: LLMEngine, waves, max_prompt, max_output, rng) -> list:
    """Serve each wave to its end; (shape, seconds) of every step, timed whole as a node's
    loop runs it: scheduling, the model, sampling, and the output bookkeeping."""
    samples = []
    shapes = []
    schedule = engine.scheduler.schedule

    def planned():
        out = schedule()
        shapes.append(None if out.is_empty else step_shape(out))
        return out

    engine.scheduler.schedule = planned
    vocab = engine.config.model.vocab_size
    for i, size in enumerate(waves):
        for j in range(size):
            n_in = int(rng.integers(8, max_prompt + 1))
            n_out = int(rng.integers(1, max_output + 1))
            params = SamplingParams(max_tokens=n_out, ignore_eos=True, temperature=0.0)
            engine.add_request(
                f"c{i}-{j}-{rng.integers(1 << 30)}", _tokens(rng, vocab, n_in), params
            )
        while engine.has_unfinished_requests():
            start = time.perf_counter()
            engine.step()
            seconds = time.perf_counter() - start
            if shapes[-1] is not None:
                samples.append((shapes[-1], seconds))
    engine.scheduler.schedule = schedule
    return samples


def _tokens(rng, vocab: int, n: int) -> list[int]:
    return rng.integers(0, vocab, n).tolist()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(
            make_model(Path(tmp) / "m", size="tiny" if args.smoke else "small")
        )
        engine_args = EngineArgs(
            model=model,
            device="cpu",
            max_num_batched_tokens=args.max_num_batched_tokens,
            enable_prefix_caching=False,
            max_model_len=args.max_prompt + args.max_output,
        )
        engine = LLMEngine.from_args(engine_args)
        shape = load_shape(model)
    rng = np.random.default_rng(0)
    waves = WAVES[:2] if args.smoke else WAVES
    max_prompt, max_output = (64, 8) if args.smoke else (args.max_prompt, args.max_output)
    timed_steps(engine, waves[:2], max_prompt, max_output, rng)  # warm-up, untimed
    samples = []
    for _ in range(1 if args.smoke else args.rounds):
        samples += timed_steps(engine, waves, max_prompt, max_output, rng)
    base = DeviceProfile(
        name="cpu",
        source=(
            f"bench/calibrate.py on {describe_host()}, torch {torch.__version__}, "
            f"{args.threads} thread(s), {shape.name} ({shape.num_params / 1e6:.1f}M params, "
            f"float32), {time.strftime('%Y-%m-%d')}"
        ),
        peak_flops=1.0,
        mem_bandwidth=1.0,
        memory_bytes=16e9,
        dtype_bytes=4,
        network_latency_s=args.network_latency_ms / 1e3,
        host_cores=os.cpu_count() or 1,
    )
    base = load_transfer_profile(args.transfer_profile).apply(base)
    links = tier_links(load_profile("cpu"))
    kept = "KV tier links kept from sim/profiles/cpu.json (bench/kv_tiers.py --copy-probe)"
    base = dataclasses.replace(base, source=f"{base.source}; {kept}", **links)
    fit = fit_profile(samples, shape, base)
    print(f"command: python -P bench/calibrate.py {' '.join(sys.argv[1:])}")
    print(f"machine: {describe_host()}, python {platform.python_version()}")
    _report(samples, fit)
    if args.out:
        fit.profile.save(args.out)
        print(f"wrote {args.out}")


def tier_links(profile: DeviceProfile) -> dict[str, float]:
    """`profile`'s KV tier links (host link and disk), which this bench does not measure."""
    names = ("host_link_bandwidth", "host_link_latency_s", "disk_bandwidth", "disk_latency_s")
    return {name: getattr(profile, name) for name in names}


def _report(samples: list[tuple[StepShape, float]], fit) -> None:
    p = fit.profile
    times = np.array([t for _, t in samples])
    tokens = np.array([s.work.num_tokens for s, _ in samples])
    print(f"steps timed: {fit.num_samples}, tokens per step {tokens.min()}-{tokens.max()}, "
          f"step time {1e3 * times.min():.2f}-{1e3 * times.max():.2f} ms")  # fmt: skip
    print(
        f"fit: overhead {1e3 * p.step_overhead_s:.3f} ms/step + "
        f"{1e6 * p.seq_overhead_s:.1f} us/seq, {p.peak_flops / 1e9:.2f} GFLOP/s, "
        f"{p.mem_bandwidth / 1e9:.2f} GB/s; median error {100 * fit.median_rel_error:.1f}%"
    )
    print(json.dumps({"profile": p.name, "median_rel_error": fit.median_rel_error}))


if __name__ == "__main__":
    main()
