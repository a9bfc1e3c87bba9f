"""The KV tiers at production scale, simulated: the whole Mooncake conversation trace on
Llama-3-8B with the H100 profile, one deployment (2 prefill + 2 decode GPUs by default),
with no lower tier and with host tiers of several sizes per GPU. Prints, per size, the
prefix hit rate (by tier), TTFT p50/p90, TPOT p90, goodput under the SLO, and the blocks
the tiers moved; one `tandem simulate` per size, in parallel processes.

    python -P bench/sim_tiers.py --host-gib 0,64,256,1024 --jobs 2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe_host

TRACE = (
    Path(__file__).resolve().parents[2] / "shared" / "traces" / "mooncake_conversation_trace.jsonl"
)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--trace", default=str(TRACE))
    p.add_argument("--num-requests", type=int, default=None, help="default: the whole trace")
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument("--device", default="h100")
    p.add_argument("--prefill", type=int, default=2)
    p.add_argument("--decode", type=int, default=2)
    p.add_argument("--max-model-len", type=int, default=32768)
    p.add_argument("--host-gib", default="0,64,256,1024", help="host tier per GPU, GiB")
    p.add_argument("--slo-ttft", type=float, default=2.0)
    p.add_argument("--slo-tpot", type=float, default=0.05)
    p.add_argument("--jobs", type=int, default=2)
    return p.parse_args()


def simulate(args: argparse.Namespace, host_gib: float, folder: Path) -> dict:
    out = folder / f"host-{host_gib:g}.json"
    command = [
        sys.executable, "-P", "-m", "tandem.cli", "simulate", "--model", args.model,
        "--device", args.device, "--workload", args.trace, "--prefill", str(args.prefill),
        "--decode", str(args.decode), "--max-model-len", str(args.max_model_len),
        "--kv-host-gib", str(host_gib), "--slo-ttft", str(args.slo_ttft),
        "--slo-tpot", str(args.slo_tpot), "--out", str(out),
    ]  # fmt: skip
    num = args.num_requests or len(Path(args.trace).read_text().splitlines())  # not 1,000
    command += ["--num-requests", str(num)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"host {host_gib} GiB: {done.stderr[-2000:]}")
    print(done.stdout.strip(), flush=True)
    return json.loads(out.read_text())


def main() -> None:
    args = parse_args()
    print("machine:", describe_host())
    print("command:", " ".join(sys.argv))
    sizes = [float(s) for s in args.host_gib.split(",")]
    with tempfile.TemporaryDirectory() as folder, ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda g: simulate(args, g, Path(folder)), sizes))
    print(json.dumps({f"{g:g}": r for g, r in zip(sizes, results)})[:200000], file=sys.stderr)


if __name__ == "__main__":
    main()
