"""Tensor parallelism on the CPU: what sending each step to the other ranks costs, what each
rank holds in memory, and TP 2 against TP 1 on a prefill-heavy and a decode-heavy workload.

    python bench/tensor_parallel.py [--size medium] [--threads 2] [--repeats 3] [--smoke]

Step broadcast: a `StepBatch` of each shape pickled down a multiprocessing pipe to an echo
process, which answers one byte; "send" is rank 0's `send` alone (what the engine's step
pays before its own forward), "round trip" adds the other side's unpickling and the answer.
Memory: each engine in a fresh process; peak RSS of every rank once its shard is loaded,
beside a process that has only imported torch and the engine. Throughput: each engine in a
fresh process with `--threads` torch threads in all (TP 2: half each; TP 1 also with one
thread, the work of one rank), greedy, EOS ignored. On a machine busy with other work,
several OpenMP threads per process can lose far more to waiting at barriers than TP gains:
the header prints the load average.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe_host


def step_batch(num_seqs: int, query_len: int, context: int, block_size: int = 16):
    """A StepBatch of `num_seqs` sequences computing `query_len` tokens each at the end of
    `context` tokens, every one sampling."""
    from tandem.engine.exec.step_batch import StepBatch

    tokens = num_seqs * query_len
    blocks = -(-context // block_size)
    qsl = np.arange(num_seqs + 1, dtype=np.int32) * query_len
    return StepBatch(
        input_ids=np.arange(tokens, dtype=np.int64),
        positions=np.tile(np.arange(context - query_len, context, dtype=np.int64), num_seqs),
        query_start_loc=qsl,
        seq_lens=np.full(num_seqs, context, dtype=np.int32),
        block_tables=np.arange(num_seqs * blocks, dtype=np.int32).reshape(num_seqs, blocks),
        slot_mapping=np.arange(tokens, dtype=np.int64),
        sample_rows=list(range(num_seqs)),
        logits_indices=(qsl[1:] - 1).astype(np.int64),
    )


def _echo(conn) -> None:
    while (batch := conn.recv()) is not None:
        conn.send_bytes(b"k" if batch.num_tokens else b"")


def bench_broadcast(iterations: int) -> None:
    import pickle

    shapes = [
        ("decode", 1, 1, 512),
        ("decode", 32, 1, 512),
        ("decode", 256, 1, 2048),
        ("prefill chunk", 1, 2048, 2048),
        ("mixed", 8, 256, 1024),
    ]
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    echo = ctx.Process(target=_echo, args=(child,), daemon=True)
    echo.start()
    print("\n## Step broadcast (StepBatch over a pipe)\n")
    print("| step | seqs | tokens | context | pickled bytes | send µs | round trip µs |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, seqs, qlen, context in shapes:
        batch = step_batch(seqs, qlen, context)
        size = len(pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL))
        for _ in range(20):
            parent.send(batch)
            parent.recv_bytes()
        send = rtt = 0.0
        for _ in range(iterations):
            t0 = time.perf_counter()
            parent.send(batch)
            t1 = time.perf_counter()
            parent.recv_bytes()
            t2 = time.perf_counter()
            send += t1 - t0
            rtt += t2 - t0
        print(
            f"| {name} | {seqs} | {seqs * qlen} | {context} | {size} | "
            f"{send / iterations * 1e6:.1f} | {rtt / iterations * 1e6:.1f} |"
        )
    parent.send(None)
    echo.join()


def _baseline_rss(queue) -> None:
    import torch  # noqa: F401

    import tandem.engine.llm  # noqa: F401

    queue.put(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def _engine_memory(queue, model_dir: str, tp: int) -> None:
    import torch

    from tandem.engine import LLM
    from tandem.engine.models.prepacked import weight_bytes
    from tandem.engine.parallel.rank_main import peak_rss_bytes, rss_bytes

    torch.set_num_threads(1)
    before = rss_bytes()
    llm = LLM(
        model_dir, dtype="float32", num_kv_blocks=16, tensor_parallel_size=tp, kernels="torch"
    )
    weights = weight_bytes(llm.engine.runner.model)
    workers = llm.engine.runner.workers
    peaks = [peak_rss_bytes(), *(workers.peak_rss_bytes if workers else [])]
    growth = [rss_bytes() - before, *(workers.load_rss_bytes if workers else [])]
    queue.put((weights, peaks, growth))
    llm.shutdown()


def _in_process(target, *args):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    process = ctx.Process(target=target, args=(queue, *args))
    process.start()
    result = queue.get()
    process.join()
    return result


def bench_memory(model_dir: Path) -> None:
    mib = 2**20
    base = _in_process(_baseline_rss)
    print("\n## Peak RSS per rank once loaded (MiB)\n")
    print(f"a process with torch and the engine imported, nothing loaded: {base / mib:.0f} MiB\n")
    print("Peak RSS, and in brackets the RSS that building and loading the engine added (rank")
    print("0 also loads the tokenizer and the engine's other parts).\n")
    print("| TP | weights held per rank | rank 0 | rank 1 |")
    print("| ---: | ---: | ---: | ---: |")
    for tp in (1, 2):
        weights, peaks, growth = _in_process(_engine_memory, str(model_dir), tp)
        cells = " | ".join(f"{p / mib:.0f} (+{g / mib:.0f})" for p, g in zip(peaks, growth))
        print(f"| {tp} | {weights / mib:.1f} | {cells}{' | -' if tp == 1 else ''} |")


def _throughput(queue, model_dir: str, tp: int, threads: int, workload, repeats: int) -> None:
    import torch

    from tandem.engine import LLM, SamplingParams

    torch.set_num_threads(threads)
    prompts, max_tokens = workload
    llm = LLM(
        model_dir,
        tensor_parallel_size=tp,
        kernels="torch",
        max_num_seqs=len(prompts),
        max_num_batched_tokens=2048,
    )
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate(prompt_token_ids=prompts[:2], sampling_params=params, use_tqdm=False)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
        times.append(time.perf_counter() - t0)
    steps = len(prompts) * max_tokens
    queue.put((min(times), steps))
    llm.shutdown()


def bench_throughput(model_dir: Path, vocab: int, threads: int, repeats: int, smoke: bool):
    rng = random.Random(0)
    n = 4 if smoke else 16

    def prompts(length: int) -> list[list[int]]:
        return [[rng.randrange(5, vocab) for _ in range(length)] for _ in range(n)]

    workloads = {
        "prefill-heavy": (prompts(64 if smoke else 512), 1),
        "decode-heavy": (prompts(16), 8 if smoke else 128),
    }
    print(f"\n## TP 2 against TP 1 (best of {repeats}; load average before: {_load()})\n")
    print("| workload | requests | TP | threads in all | seconds | prompt tok/s | output tok/s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    runs = [(1, 1), (1, threads), (2, threads)] if threads > 1 else [(1, 1), (2, 2)]
    for name, (batch, max_tokens) in workloads.items():
        for tp, total in runs:
            seconds, outputs = _in_process(
                _throughput, str(model_dir), tp, total, (batch, max_tokens), repeats
            )
            prompt_tokens = sum(len(p) for p in batch)
            print(
                f"| {name} | {len(batch)} | {tp} | {total} | {seconds:.2f} | "
                f"{prompt_tokens / seconds:.0f} | {outputs / seconds:.0f} |"
            )


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="medium", help="tandem make-model size")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, a few iterations")
    args = parser.parse_args()
    if args.smoke:
        args.size, args.repeats = "tiny", 1
    print("command: python bench/tensor_parallel.py " + " ".join(sys.argv[1:]))
    print(f"machine: {describe_host()}")
    from tandem.engine.core.config import ModelConfig
    from tandem.engine.tiny_model import make_model

    bench_broadcast(50 if args.smoke else 2000)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_model(Path(tmp) / "model", arch="llama", size=args.size)
        vocab = ModelConfig.from_pretrained(model_dir).vocab_size
        print(f"\nmodel: random llama, size {args.size}, vocab {vocab}")
        bench_memory(model_dir)
        bench_throughput(model_dir, vocab, args.threads, args.repeats, args.smoke)


if __name__ == "__main__":
    main()
