"""KV transfer between prefill and decode of different tensor-parallel sizes.

One request's prompt blocks go from every prefill rank to the decode rank(s) holding its
heads (engine.kv_heads, engine.rank_kv): real NIXL WRITEs (UCX) from this process, which
holds the prefill ranks' agents, into a second process holding the decode ranks' agents
(each rank of a real node is its own process; here each side's ranks share one, so their
posts are serialized). Per TP pair it prints descriptors per block, bytes per descriptor,
the time from the first post (the staging copy included) to the last write done, the decode
side's re-pack time, and checks every decode rank's blocks against the source.

    python -P bench/tp_transfer.py [--blocks 32] [--repeats 5] [--smoke]

The default geometry is Llama-3-8B's KV (32 layers, 8 KV heads of 128, blocks of 16 tokens,
bfloat16): 2 MiB a block over all heads.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for bench.machine

from bench.machine import describe_host
from tandem.engine.models.tensor_parallel import kv_head_range
from tandem.engine.transfer.kv_heads import cuts_of, head_range, num_descs, plan_pieces
from tandem.engine.transfer.kv_staging import staging_cuts
from tandem.engine.transfer.nixl_agent import KVTransferAgent, new_agent_name
from tandem.engine.transfer.rank_kv import PeerPiece, RankKV

PAIRS = ((1, 1), (1, 2), (2, 1), (2, 2))
POLL_S = 0.0005


def ranges(num_heads: int, size: int) -> list[tuple[int, int]]:
    return [kv_head_range(num_heads, rank, size) for rank in range(size)]


def rank_caches(
    full: torch.Tensor, size: int, fill: bool, peer_sizes: tuple[int, ...] = ()
) -> list[RankKV]:
    """One agent per rank over its heads of `full` [NB, L, 2, bs, H, D] (copied or zero),
    with the staging mirrors its writes to nodes of `peer_sizes` ranks need (planned, as a
    node plans them at start-up)."""
    out = []
    for rank, (start, count) in enumerate(ranges(full.shape[4], size)):
        cache = full[..., start : start + count, :].contiguous()
        if not fill:
            cache.zero_()
        agent = KVTransferAgent(new_agent_name("bench"), cache, start, full.shape[4])
        cuts = staging_cuts(full.shape[4], size, rank, peer_sizes)
        out.append(RankKV(agent, cache, cuts))
    return out


def _target(conn, shape: tuple[int, ...], size: int) -> None:
    """The decode side: ranks' caches and agents; progresses them until told to stop; on
    ("repack", ids, pieces) re-packs and answers with the time and each rank's blocks."""
    torch.set_num_threads(1)
    ranks = rank_caches(torch.zeros(shape, dtype=torch.bfloat16), size, fill=False)
    conn.send([r.agent.info() for r in ranks])
    while True:
        if not conn.poll(POLL_S):
            for r in ranks:
                r.agent.progress()
            continue
        message = conn.recv()
        if message is None:
            return
        _, ids, pieces = message
        start = time.perf_counter()
        for d, r in enumerate(ranks):
            cuts = cuts_of([p for p in pieces if p.dst == d], r.heads)
            if cuts != [(0, r.heads[1])]:
                r.repack(ids, cuts)
        took = time.perf_counter() - start
        conn.send((took, [r.kv_cache[ids].clone() for r in ranks]))


def bench_pair(full: torch.Tensor, p: int, d: int, ids: list[int], repeats: int) -> dict:
    parent, target, far = _start_target(tuple(full.shape), d)
    src = rank_caches(full, p, fill=True, peer_sizes=(d,))
    pieces = plan_pieces([r.heads for r in src], [head_range(i.layout) for i in far])
    times, repacks = [], []
    for attempt in range(repeats + 1):  # the first connects the agents: not counted
        start = time.perf_counter()
        for rank, rank_kv in enumerate(src):
            parts = [PeerPiece(far[x.dst], x) for x in pieces if x.src == rank]
            if parts:
                rank_kv.write(attempt * 10 + rank, parts, ids, ids)
        while any(r.num_in_flight for r in src):
            for r in src:
                assert all(state == "DONE" for _, state in r.poll())
        took = time.perf_counter() - start
        parent.send(("repack", ids, pieces))
        repack_s, blocks = parent.recv()
        if attempt:
            times.append(took)
            repacks.append(repack_s)
        _check(blocks, full, ids)
    parent.send(None)
    target.join()
    heads = [r.heads for r in src]
    descs = sum(num_descs(x, heads[x.src], head_range(far[x.dst].layout), ids, ids)
                for x in pieces)  # fmt: skip
    block_bytes = full[0].numel() * full.element_size()
    moved = block_bytes * len(ids)
    return {
        "pair": f"{p} -> {d}",
        "descs_per_block": descs / len(ids),
        "bytes_per_desc": moved // descs,
        "transfer_ms": statistics.median(times) * 1e3,
        "gib_s": moved / statistics.median(times) / 2**30,
        "repack_ms": statistics.median(repacks) * 1e3,
    }


def bench_strided(full: torch.Tensor, ids: list[int], repeats: int) -> dict:
    """1 -> 2 without staging: one descriptor per (block, layer, K/V, token) row of each D
    rank's heads, straight from P's block-major cache (what the staging avoids)."""
    parent, target, far = _start_target(tuple(full.shape), 2)
    (src,) = rank_caches(full, 1, fill=True)
    num_heads, elem = full.shape[4], full.element_size()
    row = num_heads * full.shape[5] * elem  # one (layer, K/V, token) row of every head
    rows = full[0].numel() * elem // row
    times = []
    for attempt in range(repeats + 1):
        start = time.perf_counter()
        transfers = []
        for d, info in enumerate(far):
            part = row // len(far)
            local = [
                (
                    src.agent.layout.base_addr
                    + b * src.agent.layout.block_bytes
                    + r * row
                    + d * part,
                    part,
                    0,
                )
                for b in ids
                for r in range(rows)
            ]
            remote = [(info.layout.base_addr + b * info.layout.block_bytes + r * part, part, 0)
                      for b in ids for r in range(rows)]  # fmt: skip
            src.agent.connect(info)
            transfers.append(src.agent.write_descs(info.name, local, remote, len(ids)))
        while any(src.agent.poll(t) == "PROC" for t in transfers):
            pass
        if attempt:
            times.append(time.perf_counter() - start)
    parent.send(("repack", ids, plan_pieces([src.heads], [head_range(i.layout) for i in far])))
    _, blocks = parent.recv()
    _check(blocks, full, ids)
    parent.send(None)
    target.join()
    moved = full[0].numel() * elem * len(ids)
    return {"descs": rows * len(far), "bytes": row // len(far), "ms": statistics.median(times)
            * 1e3, "gib_s": moved / statistics.median(times) / 2**30}  # fmt: skip


def _start_target(shape: tuple[int, ...], size: int) -> tuple:
    """The decode side's process of `size` ranks: (our pipe end, the process, its agents)."""
    parent, child = mp.Pipe()
    target = mp.get_context("spawn").Process(target=_target, args=(child, shape, size))
    target.start()
    child.close()  # ours: a target that dies is then an EOFError here, not a hang
    return parent, target, parent.recv()


def _check(blocks: list[torch.Tensor], full: torch.Tensor, ids: list[int]) -> None:
    """Each decode rank's received blocks are exactly its heads of the source's."""
    for (first, count), got in zip(ranges(full.shape[4], len(blocks)), blocks):
        assert torch.equal(got, full[ids][..., first : first + count, :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=32, help="blocks per request")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="a tiny geometry, one repeat")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.smoke:
        shape, args.blocks, args.repeats = (8, 2, 2, 4, 4, 8), 4, 1
    else:
        shape = (args.blocks + 8, 32, 2, 16, 8, 128)  # [NB, L, K/V, bs, KV heads, D]
    full = torch.randn(shape).to(torch.bfloat16)
    ids = list(range(2, 2 + args.blocks))  # adjacent on both sides
    print(f"command: python {' '.join(sys.argv)}")
    print(f"machine: {describe_host()}; torch {torch.__version__}")
    print(f"{args.blocks} blocks of {full[0].numel() * 2 / 2**20:.2f} MiB (all heads) a request")
    print("| P -> D | descriptors / block | bytes / descriptor | transfer ms | GiB/s | "
          "re-pack ms |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for p, d in PAIRS:
        r = bench_pair(full, p, d, ids, args.repeats)
        print(
            f"| {r['pair']} | {r['descs_per_block']:.2f} | {r['bytes_per_desc']:,} | "
            f"{r['transfer_ms']:.1f} | {r['gib_s']:.2f} | {r['repack_ms']:.1f} |"
        )
    r = bench_strided(full, ids, args.repeats)
    print(
        f"| 1 -> 2 strided, no staging | {r['descs']:,} | {r['bytes']:,} | {r['ms']:.1f} | "
        f"{r['gib_s']:.2f} | - |"
    )


if __name__ == "__main__":
    main()
