"""KV transfer benchmark.

1. NIXL WRITE throughput between two processes (UCX, host memory here, GPU memory where
   there is one) for runs of 1 to 512 adjacent blocks, against a plain in-process copy of
   the same bytes (`dst[ids] = src[ids]` on the same device); and the same blocks written
   scattered (into reversed destinations: one descriptor per block). `--profile-out FILE`
   fits the simulator's KV-link constants (per write, per descriptor, bytes/s) to these
   writes and saves them as a transfer profile (`tandem simulate --transfer-profile FILE`).
2. Time to first token of one disaggregated request through real prefill and decode node
   processes, broken into queue, remote prefill, transfer and the first decode step.

    python -P bench/transfer.py [--block-kib 2048] [--skip-ttft] [--smoke] [--hugepages]
        [--profile-out FILE]

`--hugepages` puts the host buffers (both agents' and the copy's) on the kernel's reserved
huge pages, as `--kv-hugepages` does for a node's KV pool.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for tests.disagg.nodes
sys.path.insert(0, str(Path(__file__).resolve().parent))  # for machine

from machine import describe_host  # bench/machine.py

from tandem.engine.exec.host_memory import huge_page_bytes, hugepage_zeros
from tandem.engine.transfer.nixl_agent import KVTransferAgent, new_agent_name
from tandem.sim.transfer_profile import TransferPoint, fit_transfer
from tests.disagg.nodes import Node, start_all

RUNS = (1, 4, 16, 64, 128, 512)
SMOKE_RUNS = (1, 4)
MIN_SECONDS = 0.25
POLL_S = 0.001  # the decode node's wait between polls while a remote prefill is due


def _zeros(num_blocks: int, block_bytes: int, device: str, hugepages: bool) -> torch.Tensor:
    if hugepages:
        return hugepage_zeros((num_blocks, block_bytes), torch.uint8)
    return torch.zeros(num_blocks, block_bytes, dtype=torch.uint8, device=device)


def _target(conn, num_blocks: int, block_bytes: int, device: str, hugepages: bool) -> None:
    torch.set_num_threads(1)
    cache = _zeros(num_blocks, block_bytes, device, hugepages)
    agent = KVTransferAgent(new_agent_name("bench-decode"), cache)
    conn.send(agent.info())
    # Until the writer is done, poll the agent every millisecond, as a decode node does while
    # it waits for remote prefills: our agents run no progress thread, and UCX only answers
    # the writer's connection handshake when the target makes progress.
    while not conn.poll(POLL_S):
        agent.notifications()
    conn.recv()


def _time_pair(first, second, repeat: int, min_seconds: float = MIN_SECONDS) -> list[float]:
    """Median seconds of `first()` and of `second()`, called in turn (so both meet the
    caches in the same state) at least `repeat` times each and for at least `min_seconds`
    together: a run of one block takes 0.2 ms, and five samples of it are mostly noise."""
    fns = (first, second)
    for fn in fns:
        fn()  # warm-up
    samples: list[list[float]] = [[], []]
    while len(samples[0]) < repeat or sum(map(sum, samples)) < min_seconds:
        for fn, times in zip(fns, samples):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return [statistics.median(times) for times in samples]


def bench_throughput(
    block_bytes: int,
    device: str,
    repeat: int,
    runs: tuple[int, ...] = RUNS,
    hugepages: bool = False,
) -> list[tuple]:
    """Source, target and the copy's destination all on huge pages when `hugepages`."""
    num_blocks = max(runs)
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_target, args=(there, num_blocks, block_bytes, device, hugepages))
    proc.start()
    there.close()  # ours: a target that dies is then an EOFError here, not a hang
    info = here.recv()
    src = _zeros(num_blocks, block_bytes, device, hugepages)
    src.copy_(torch.randint(0, 255, (num_blocks, block_bytes), dtype=torch.uint8, device=device))
    agent = KVTransferAgent(new_agent_name("bench-prefill"), src)
    agent.connect(info)
    local = _zeros(num_blocks, block_bytes, device, hugepages)
    rows = []
    for n in runs:
        ids = list(range(n))

        def write(ids=ids) -> None:
            t = agent.write_blocks(info.name, ids, ids)
            while agent.poll(t) == "PROC":
                pass
            assert t.state == "DONE", t.state

        def scattered(ids=ids) -> None:
            t = agent.write_blocks(info.name, ids, ids[::-1])  # no run: a descriptor per block
            while agent.poll(t) == "PROC":
                pass
            assert t.state == "DONE" and t.num_descs == len(ids), (t.state, t.num_descs)

        def copy(n=n) -> None:
            local[:n].copy_(src[:n])
            if device == "cuda":
                torch.cuda.synchronize()

        nixl_s, copy_s = _time_pair(write, copy, repeat)
        scattered_s, _ = _time_pair(scattered, copy, repeat)
        gb = n * block_bytes / 1e9
        rows.append(
            (n, n * block_bytes, nixl_s, gb / nixl_s, gb / copy_s, copy_s / nixl_s, scattered_s)
        )
    here.send("done")
    proc.join(10)
    return rows


def bench_ttft(model: Path, repeat: int) -> list[dict]:
    logs = Path(tempfile.mkdtemp())
    p = Node("prefill", model, logs)
    d = Node("decode", model, logs)
    start_all(p, d)
    client = httpx.Client(timeout=60)  # made once: a new client costs tens of ms (TLS setup)
    try:
        rows = []
        for i in range(repeat + 1):
            prompt = [(i * 7919 + j) % 500 + 5 for j in range(512)]
            start = time.perf_counter()
            first = second = None
            body = {
                "request_id": f"ttft-{i}",
                "token_ids": prompt,
                "prefill": p.endpoint,
                "sampling": {"max_tokens": 2, "temperature": 0, "ignore_eos": True},
            }
            with client.stream("POST", f"{d.url}/generate", json=body, headers=d.headers) as r:
                for line in r.iter_lines():
                    if first is None:
                        first, timings = time.perf_counter() - start, line
                    else:
                        second = time.perf_counter() - start
            t = json.loads(timings)["timings"]
            if i:  # the first request warms both nodes up
                rows.append({"ttft_s": first, "first_decode_s": second - first, **t})
        return rows
    finally:
        client.close()
        p.stop()
        d.stop()


def write_profile(rows: list[tuple], path: str, machine: str) -> None:
    """Fit the simulator's KV-link constants to the contiguous and scattered writes."""
    points = []
    for n, size, nixl_s, *_, scattered_s in rows:
        points.append(TransferPoint(n, 1, size, nixl_s))
        if n > 1:
            points.append(TransferPoint(n, n, size, scattered_s))
    command = f"python {' '.join(sys.argv)}"
    source = f"{command} on {machine}, {time.strftime('%Y-%m-%d', time.gmtime())}"
    fit = fit_transfer(points, source)
    fit.save(path)
    print(
        f"\nfitted KV link: {fit.kv_link_bandwidth / 1e9:.2f} GB/s, "
        f"{fit.kv_transfer_latency_s * 1e6:.1f} us per write, "
        f"{fit.kv_descriptor_s * 1e6:.2f} us per descriptor "
        f"(median error {100 * fit.median_rel_error:.1f}% over {len(points)} writes) -> {path}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--block-kib",
        type=int,
        default=2048,
        help="bytes per block (2048 KiB: Llama-3-8B in bf16, 16 tokens)",
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--skip-ttft", action="store_true")
    parser.add_argument("--model", type=Path, default=None, help="default: a new small model")
    parser.add_argument(
        "--smoke", action="store_true", help="64 KiB blocks, runs of 1 and 4, one repeat"
    )
    parser.add_argument(
        "--hugepages",
        action="store_true",
        help="host buffers on reserved huge pages (3 x the largest run: sysctl vm.nr_hugepages)",
    )
    parser.add_argument(
        "--profile-out", default=None, help="fit the KV-link constants and write them here"
    )
    args = parser.parse_args()
    if args.hugepages and args.device != "cpu":
        parser.error("--hugepages is for host buffers (--device cpu)")
    runs = RUNS
    if args.smoke:
        args.block_kib, args.repeat, runs = 64, 1, SMOKE_RUNS
    torch.set_num_threads(1)
    print(f"command: python {' '.join(sys.argv)}")
    print(
        f"machine: {platform.node()} {platform.machine()} {torch.get_num_interop_threads()} "
        f"interop threads, device {args.device}, torch {torch.__version__}"
    )
    block_bytes = args.block_kib * 1024
    pages = f"{huge_page_bytes() >> 20} MiB huge pages" if args.hugepages else "default pages"
    print(
        f"\nNIXL WRITE between two processes vs in-process copy, {args.block_kib} KiB blocks, "
        f"host buffers on {pages}"
    )
    print("| blocks | bytes | NIXL ms | NIXL GB/s | copy GB/s | NIXL/copy | scattered ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    rows = bench_throughput(block_bytes, args.device, args.repeat, runs, args.hugepages)
    for n, size, nixl_s, nixl_bw, copy_bw, ratio, scattered_s in rows:
        print(
            f"| {n} | {size / 2**20:g} MiB | {nixl_s * 1e3:.2f} | {nixl_bw:.2f} | {copy_bw:.2f} "
            f"| {ratio:.0%} | {scattered_s * 1e3:.2f} |"
        )
    if args.profile_out:
        write_profile(rows, args.profile_out, f"{describe_host()}, {args.device}, {pages}")
    if args.skip_ttft:
        return
    model = args.model
    if model is None:
        from tandem.engine.tiny_model import make_model

        model = make_model(Path(tempfile.mkdtemp()) / "small", size="small")
    rows = bench_ttft(model, args.repeat)
    print(f"\nTTFT of one disaggregated 512-token request ({model.name}), median of {len(rows)}")
    keys = ["ttft_s", "queue_s", "remote_s", "prefill_s", "transfer_s", "first_decode_s"]
    print("| " + " | ".join(k.removesuffix("_s") + " ms" for k in keys) + " |")
    print("|" + "---:|" * len(keys))
    print(
        "| " + " | ".join(f"{statistics.median(r[k] for r in rows) * 1e3:.1f}" for k in keys) + " |"
    )


if __name__ == "__main__":
    main()
