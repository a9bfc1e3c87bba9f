"""KV tiers on a real `tandem serve` (one prefill, one decode node, this machine): a slice of
the Mooncake conversation trace, lengths and time scaled down, replayed on a device pool
far smaller than its working set, without and with a host tier (and with host + disk),
each a fresh deployment, `--repeats` times. Prints, per run, the prefix hit rate of each
node by tier (from the nodes' own counters: tokens found cached over tokens looked up),
TTFT p50/p90, and the blocks the tiers moved; then the medians per configuration.

    OMP_NUM_THREADS=1 python -P bench/kv_tiers.py --num-requests 1200 --length-scale 64 \\
        --time-scale 8 --num-kv-blocks 512 --host-blocks 16384 --repeats 3 [--simulate]

With `--simulate`, the same requests are then simulated with the shipped cpu profile, each
configuration's figures printed under the real medians.

First the copy cost of each tier (`TierCopier`, this machine's memory and disk) for copies
of 1-256 blocks of the served model's block and of the `small` model's (the one
sim/profiles/cpu.json is fitted on), the tier links' constants fitted to them (the cpu
profile's `host_link_*` and `disk_*`), and a step's time with and without copies running
beside it; `--copy-probe`: only those.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

import httpx
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for tests.disagg.nodes

from local_serve import local_serve, worker_entries
from machine import describe_host
from replay_client import replay

from tandem.engine.core.sampling_params import SamplingParams
from tandem.engine.core.tier_ops import DEVICE, DISK, HOST, TierCopy
from tandem.engine.engine_args import EngineArgs
from tandem.engine.exec.model_shard import kv_block_bytes
from tandem.engine.exec.tier_copier import TierCopier
from tandem.engine.llm_engine import LLMEngine
from tandem.engine.tiny_model import make_model
from tandem.sim.calibration import nonnegative_lstsq
from tandem.sim.cluster import ClusterConfig
from tandem.sim.profiles import load_profile
from tandem.sim.results import SLO, summarize
from tandem.sim.shapes import load_shape
from tandem.sim.simulate import run_cluster
from tandem.sim.traces import read_trace
from tandem.sim.workload import SimRequest, fit_lengths, scale_load
from tests.disagg.nodes import metric_value

TRACE = (
    Path(__file__).resolve().parents[2] / "shared" / "traces" / "mooncake_conversation_trace.jsonl"
)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--trace", default=str(TRACE))
    p.add_argument("--num-requests", type=int, default=1200)
    p.add_argument("--length-scale", type=float, default=64)
    p.add_argument("--time-scale", type=float, default=8)
    p.add_argument("--num-kv-blocks", type=int, default=512, help="each node's device pool")
    p.add_argument("--host-blocks", type=int, default=16384, help="the host tier, in blocks")
    p.add_argument("--disk-blocks", type=int, default=0, help="also run host+disk (0: no)")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--port", type=int, default=8391)
    p.add_argument("--copy-probe", action="store_true", help="only the per-block copy costs")
    p.add_argument(
        "--simulate", action="store_true",
        help="also simulate the same requests (the shipped cpu profile) and print those figures",
    )  # fmt: skip
    return p.parse_args()


def block_gib(model: str) -> float:
    config = EngineArgs(model, dtype="float32", num_kv_blocks=1).create_config()
    return kv_block_bytes(config) / 2**30


def serve_command(args, model: str, host_gib: float, disk_gib: float, disk_dir: str) -> list[str]:
    return [
        sys.executable, "-P", "-m", "tandem.cli", "serve", "--model", model, "--port",
        str(args.port), "--num-kv-blocks", str(args.num_kv_blocks), "--dtype", "float32",
        "--max-model-len", str(args.max_model_len), "--threads", "1",
        "--kv-host-gib", repr(host_gib), "--kv-disk-gib", repr(disk_gib), "--kv-disk-dir", disk_dir,
    ]  # fmt: skip


def node_figures(base: str) -> dict[str, dict[str, float]]:
    """Per role: tokens looked up, found per tier, blocks moved per tier and direction."""
    out = {}
    for w in worker_entries(httpx.get(f"{base}/workers", timeout=10).json()):
        text = httpx.get(w["metrics_url"], timeout=10).text
        fig = {"queries": metric_value(text, "tandem_prefix_cache_queries_total")}
        for tier in (DEVICE, HOST, DISK):
            fig[f"hit_{tier}"] = metric_value(text, "tandem_kv_tier_hits_total", tier=tier)
        for tier in (HOST, DISK):
            for d in ("down", "up"):
                fig[f"{tier}_{d}"] = metric_value(
                    text, "tandem_kv_tier_blocks_moved_total", tier=tier, direction=d
                )
        out[w["role"]] = fig
    return out


def one_run(args, model: str, requests: list[SimRequest], host: int, disk: int) -> dict:
    gib = block_gib(model)
    with tempfile.TemporaryDirectory() as disk_dir:
        command = serve_command(args, model, host * gib * 1.0001, disk * gib * 1.0001, disk_dir)
        base = f"http://127.0.0.1:{args.port}"
        with local_serve(command, base, 2):
            warm = [SimRequest.of_tokens(f"w{i}", 0.0, [7 + i] * 64, 4) for i in range(4)]
            asyncio.run(replay(base, warm))
            before = node_figures(base)
            results, duration = asyncio.run(replay(base, requests))
            after = node_figures(base)
    ttft = [r["ttft"] for r in results]
    nodes = {
        role: {k: after[role][k] - before[role].get(k, 0.0) for k in after[role]} for role in after
    }
    return {
        "ttft_p50": float(np.percentile(ttft, 50)), "ttft_p90": float(np.percentile(ttft, 90)),
        "duration_s": duration, "nodes": nodes,
    }  # fmt: skip


def hit_rate(node: dict[str, float]) -> float:
    found = sum(node[f"hit_{t}"] for t in (DEVICE, HOST, DISK))
    return found / node["queries"] if node["queries"] else 0.0


def print_run(name: str, i: int, run: dict) -> None:
    rates = "  ".join(
        f"{role} hit {hit_rate(n):.3f} (device {n['hit_device']:.0f} host {n['hit_host']:.0f} "
        f"disk {n['hit_disk']:.0f} of {n['queries']:.0f} tokens; host down {n['host_down']:.0f} "
        f"up {n['host_up']:.0f}, disk down {n['disk_down']:.0f} up {n['disk_up']:.0f})"
        for role, n in sorted(run["nodes"].items())
    )
    ttft = f"TTFT p50 {run['ttft_p50'] * 1e3:7.1f} ms  p90 {run['ttft_p90'] * 1e3:7.1f} ms"
    print(f"{name:>10} #{i}: {ttft}  {run['duration_s']:.1f} s  {rates}", flush=True)


def copy_probe(models: dict[str, str]) -> None:
    """Each copy direction through the real `TierCopier` (its own thread), for copies of
    `PROBE_BLOCKS` blocks of each model's block size; then each tier link's constants,
    `latency + bytes / bandwidth`, fitted to them by the relative error (the device
    profile's `host_link_*` from device<->host, `disk_*` from host->disk and
    disk->device)."""
    points: dict[str, list[tuple[int, float]]] = {HOST: [], DISK: []}  # (bytes, seconds)
    for name, model in models.items():
        copies = probe_copies(model)
        for src, dst, n, size, seconds in copies:
            points[DISK if DISK in (src, dst) else HOST].append((n * size, seconds))
            if n == PROBE_BLOCKS[-1]:
                per_block = seconds / n
                print(f"copy {src:>6} -> {dst:<6}: {per_block * 1e6:7.2f} us per block of {size} "
                      f"bytes ({size / per_block / 1e9:.2f} GB/s; {name}, {n} blocks)")  # fmt: skip
        for src, dst in dict.fromkeys((c[0], c[1]) for c in copies):
            times = "  ".join(
                f"{n}: {1e6 * t:.0f}" for s, d, n, _, t in copies if (s, d) == (src, dst)
            )
            print(f"  {name} {src} -> {dst}, us per copy of N blocks: {times}")
    for link, prefix in ((HOST, "host_link"), (DISK, "disk")):
        latency, bandwidth, error = fit_link(points[link])
        print(f"{prefix}: {prefix}_latency_s {latency:.3g}, {prefix}_bandwidth {bandwidth:.4g} "
              f"(median error {100 * error:.1f}% over {len(points[link])} copies)")  # fmt: skip


PROBE_BLOCKS = (1, 4, 16, 64, 256)


def probe_copies(model: str) -> list[tuple[str, str, int, int, float]]:
    """(src, dst, blocks, block bytes, median seconds of 5) of every direction and size:
    from the submission to the copier's thread reporting the copy done (`StampedDone`), so
    the probe's own polling period is not counted."""
    config = EngineArgs(model, dtype="float32", num_kv_blocks=1024).create_config()
    kv = torch.randn((1024, *config_block_shape(config)))
    size = kv[0].numel() * 4
    out = []
    with tempfile.TemporaryDirectory() as folder:
        copier = TierCopier(kv, host_blocks=1024, disk_blocks=1024, disk_dir=folder)
        copier._done = done = StampedDone()
        copy_id = 0
        for src, dst in ((DEVICE, HOST), (HOST, DEVICE), (HOST, DISK), (DISK, DEVICE)):
            for n in PROBE_BLOCKS:
                slots = tuple(range(n))
                times = []
                for _ in range(5):
                    start = time.perf_counter()
                    copier.submit(TierCopy(copy_id, src, dst, slots, slots))
                    copy_id += 1
                    while not copier.poll():
                        copier._thread.join(0.0002)
                    times.append(done.stamps[-1] - start)
                out.append((src, dst, n, size, statistics.median(times)))
        copier.close()
    return out


class StampedDone(deque):
    """A `TierCopier`'s list of finished copies that notes when its thread added each."""

    def __init__(self) -> None:
        super().__init__()
        self.stamps: list[float] = []

    def append(self, item: tuple[int, bool]) -> None:
        self.stamps.append(time.perf_counter())
        super().append(item)


def fit_link(points: list[tuple[int, float]]) -> tuple[float, float, float]:
    """(latency, bytes/s, median relative error) of `seconds = latency + bytes / bw`."""
    a = np.asarray([[1.0, b] for b, _ in points])
    y = np.asarray([s for _, s in points])
    a = a / y[:, None]
    scale = a.max(axis=0)
    latency, per_byte = nonnegative_lstsq(a / scale, np.ones_like(y)) / scale
    errors = [abs((latency + b * per_byte) / s - 1) for b, s in points]
    return float(latency), 1.0 / per_byte, float(np.median(errors))


def step_probe(model: str, host_blocks: int = 0, repeats: int = 3) -> list[float]:
    """Per engine step, seconds: 16 sequences of 256-token prompts, chunked, then 48 tokens
    each, on an engine with or without a host tier. Every full block is copied down beside
    the steps when there is one (stores, no loads: the prompts share nothing)."""
    gib = host_blocks * block_gib(model) * 1.0001
    args = EngineArgs(model, dtype="float32", num_kv_blocks=2048, max_num_batched_tokens=512,
                      max_model_len=512, kv_host_gib=gib)  # fmt: skip
    engine = LLMEngine(args.create_config())
    times = []
    try:
        for rep in range(repeats):
            for i in range(16):
                prompt = [(rep * 4099 + i * 257 + t) % 500 + 1 for t in range(256)]
                params = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
                engine.add_request(f"r{rep}-{i}", prompt, params)
            while engine.has_unfinished_requests():
                start = time.perf_counter()
                engine.step()
                times.append(time.perf_counter() - start)
    finally:
        engine.shutdown()
    return times


def print_step_probe(model: str) -> None:
    for host in (0, 8192):
        times = step_probe(model, host)
        print(f"steps with {'a host tier' if host else 'no tier':>11}: {len(times)} steps, "
              f"median {statistics.median(times) * 1e3:.2f} ms, mean "
              f"{statistics.fmean(times) * 1e3:.2f} ms")  # fmt: skip


def config_block_shape(config) -> tuple[int, ...]:
    m = config.model
    return (m.num_layers, 2, config.cache.block_size, m.num_kv_heads, m.head_dim)


def main() -> None:
    args = parse_args()
    print("machine:", describe_host())
    print("command:", " ".join(sys.argv))
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        model = str(make_model(Path(folder) / "llama", arch="llama", seed=0))
        small = str(make_model(Path(folder) / "small", size="small", seed=0))
        copy_probe({"tiny": model, "small": small})
        print_step_probe(model)
        if args.copy_probe:
            return
        vocab = EngineArgs(model, num_kv_blocks=1).create_config().model.vocab_size
        trace = read_trace(args.trace, vocab, args.num_requests, args.length_scale)
        requests = fit_lengths(scale_load(trace, args.time_scale), args.max_model_len)
        configs = [("device", 0, 0), ("host", args.host_blocks, 0)]
        if args.disk_blocks:
            configs.append(("host+disk", args.host_blocks // 8, args.disk_blocks))
        runs: dict[str, list[dict]] = {name: [] for name, _, _ in configs}
        for i in range(args.repeats):
            for name, host, disk in configs:
                run = one_run(args, model, requests, host, disk)
                runs[name].append(run)
                print_run(name, i, run)
        print("medians:")
        for name, rs in runs.items():
            med = {k: statistics.median(r[k] for r in rs) for k in ("ttft_p50", "ttft_p90")}
            hits = {role: statistics.median(hit_rate(r["nodes"][role]) for r in rs)
                    for role in rs[0]["nodes"]}  # fmt: skip
            print(f"{name:>10}: TTFT p50 {med['ttft_p50'] * 1e3:.1f} ms  p90 "
                  f"{med['ttft_p90'] * 1e3:.1f} ms  hit rate {hits}")  # fmt: skip
        if args.simulate:
            simulate_configs(args, model, requests, configs)


def simulate_configs(
    args, model: str, requests: list[SimRequest], configs: list[tuple[str, int, int]]
) -> None:
    """The same requests in the simulator with the shipped cpu profile (not fitted to these
    runs), each configuration as `tandem serve` ran it: one prefill and one decode node of
    `--num-kv-blocks`, kv-aware routing, remote prefill always, the same tiers."""
    shape, profile = load_shape(model), load_profile("cpu")
    print("simulated (sim/profiles/cpu.json):")
    for name, host, disk in configs:
        config = ClusterConfig(
            num_kv_blocks=args.num_kv_blocks, max_model_len=args.max_model_len,
            kv_host_blocks=host, kv_disk_blocks=disk,
        )  # fmt: skip
        cluster, records = run_cluster(config, shape, profile, requests)
        s = summarize(cluster, records, SLO())
        pc, moved = s["prefix_cache"], s["kv_tiers"]["moved"]
        hits = {role: round(pc[f"{role}_hit_rate"] or 0.0, 3) for role in ("decode", "prefill")}
        print(f"{name:>10}: TTFT p50 {s['ttft_s']['p50'] * 1e3:.1f} ms  p90 "
              f"{s['ttft_s']['p90'] * 1e3:.1f} ms  hit rate {hits}  tokens by tier "
              f"{pc['tier_hits']}  host down {moved['host']['down']} up {moved['host']['up']}, "
              f"disk down {moved['disk']['down']} up {moved['disk']['up']}")  # fmt: skip


if __name__ == "__main__":
    main()
