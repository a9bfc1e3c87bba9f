"""Where a burst of long prompts spends its time to first token on a real `tandem serve`:
the router's per-request phases (`tandem_request_phase_seconds`: queue, remote_prefill,
kv_transfer, other) averaged over each burst of prompts sent at once.

    OMP_NUM_THREADS=1 python -P bench/burst_phases.py --prefill 2 --decode 2 \\
        --burst-size 8 --prompt-len 700 --bursts 5

Prompts are distinct random token ids (no prefix-cache hit), streamed with `ignore_eos`;
each burst starts once the previous one has finished. `kv_transfer` is what the transfer
adds after the prefill worker sampled the first token (its last write, the notification,
the decode node noticing it), so it measures how soon a busy prefill worker notifies.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from local_serve import local_serve
from machine import describe_host
from replay_client import replay
from sim_validate import router_phases

from tandem.engine.api.ports import free_port
from tandem.engine.tiny_model import make_model
from tandem.router.phase_metrics import TTFT_PHASES
from tandem.sim.workload import SimRequest


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="default: make-model --size small")
    p.add_argument("--prefill", type=int, default=2)
    p.add_argument("--decode", type=int, default=2)
    p.add_argument("--burst-size", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=700)
    p.add_argument("--output-len", type=int, default=4)
    p.add_argument("--bursts", type=int, default=5)
    p.add_argument("--vocab-size", type=int, default=500, help="token ids drawn below this")
    p.add_argument("--num-kv-blocks", type=int, default=512)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--port", type=int, default=18090)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="tiny: keeps the code from rotting")
    args = p.parse_args()
    if args.smoke:
        args.prefill = args.decode = 1
        args.burst_size, args.prompt_len, args.output_len, args.bursts = 2, 64, 2, 1
        args.port = free_port()
    return args


def burst(args: argparse.Namespace, rng: random.Random, index: int) -> list[SimRequest]:
    return [
        SimRequest.of_tokens(
            f"b{index}-{i}",
            0.0,
            [rng.randrange(1, args.vocab_size) for _ in range(args.prompt_len)],
            args.output_len,
        )
        for i in range(args.burst_size)
    ]


def phase_means(base: str, requests: list[SimRequest]) -> dict[str, float]:
    """Serve `requests` at once; each TTFT phase's mean over them (seconds), and TTFT's."""
    before = router_phases(base)
    results, _ = asyncio.run(replay(base, requests))
    after = router_phases(base)
    means = {
        k: (after[k][0] - before[k][0]) / max(after[k][1] - before[k][1], 1) for k in TTFT_PHASES
    }
    means["ttft"] = sum(r["ttft"] for r in results) / len(results)
    return means


def run(args: argparse.Namespace, model: str) -> list[dict[str, float]]:
    command = [
        sys.executable, "-P", "-m", "tandem.cli", "serve", "--model", model,
        "--prefill", str(args.prefill), "--decode", str(args.decode),
        "--remote-prefill-threshold", "0", "--port", str(args.port),
        "--num-kv-blocks", str(args.num_kv_blocks), "--max-model-len", str(args.max_model_len),
        "--threads", "1",
    ]  # fmt: skip
    base = f"http://127.0.0.1:{args.port}"
    rng = random.Random(args.seed)
    with local_serve(command, base, args.prefill + args.decode):
        phase_means(base, burst(args, rng, -1))  # untimed: first steps, connections
        return [phase_means(base, burst(args, rng, i)) for i in range(args.bursts)]


def main() -> None:
    args = parse_args()
    print(f"command: python -P bench/burst_phases.py {' '.join(sys.argv[1:])}")
    print(f"machine: {describe_host()}")
    with tempfile.TemporaryDirectory() as tmp:
        size = "tiny" if args.smoke else "small"
        model = args.model or str(make_model(Path(tmp) / size, size=size))
        bursts = run(args, model)
    columns = [*TTFT_PHASES, "ttft"]
    print("| burst | " + " | ".join(f"{c} ms" for c in columns) + " |")
    print("| --- |" + " ---: |" * len(columns))
    for i, means in enumerate(bursts):
        print(f"| {i} | " + " | ".join(f"{means[c] * 1e3:.1f}" for c in columns) + " |")
    mean = {c: sum(b[c] for b in bursts) / len(bursts) for c in columns}
    print("| mean | " + " | ".join(f"{mean[c] * 1e3:.1f}" for c in columns) + " |")


if __name__ == "__main__":
    main()
