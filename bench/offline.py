"""Offline throughput: Tandem's engine against transformers' batched `generate`.

Same random Llama-shaped checkpoint, same requests (fixed seeds), greedy, EOS ignored so
every request produces exactly its output length. Useful output tokens per second for both,
and their ratio, over `--repeats` workloads of the same shape after one untimed warm-up.
transformers runs each batch statically: every sequence is padded to the longest prompt
and decodes until the longest output, which is how it serves a batch.

    python bench/offline.py [--num-requests 64] [--repeats 3] [--threads 2] [--profile]
                            [--keep-heap] [--smoke]

`--keep-heap` sets glibc's malloc, for the whole process and so for both systems, to keep
freed memory (mmap threshold 64 MiB, trim threshold 1 GiB) instead of returning it to the
kernel and page-faulting it back: the figures under "A malloc that keeps its heap" in
docs/performance.md.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import platform
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch

from tandem.engine import LLM, SamplingParams
from tandem.engine.core.config import ModelConfig
from tandem.engine.tiny_model import make_model


def requests(n: int, seed: int, vocab: int, prompt_range, output_range):
    rng = random.Random(seed)
    prompts = [
        [rng.randrange(5, vocab) for _ in range(rng.randint(*prompt_range))] for _ in range(n)
    ]
    outputs = [rng.randint(*output_range) for _ in range(n)]
    return prompts, outputs


def run_tandem(model_dir, warmup, workloads, args):
    """Serves `warmup` untimed, then each workload: [(output token ids, seconds, faults)]."""
    llm = LLM(
        str(model_dir),
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        kv_hugepages=args.kv_hugepages,
    )
    _tandem_generate(llm, *warmup)
    results = []
    for i, (prompts, out_lens) in enumerate(workloads):
        profiler = None
        if args.profile and i == 0:
            from pyinstrument import Profiler

            profiler = Profiler(interval=0.0005)
            profiler.start()
        results.append(_measure(_tandem_generate, llm, prompts, out_lens))
        if profiler is not None:
            profiler.stop()
            print(profiler.output_text(unicode=False, color=False, show_all=False))
    return results


def _tandem_generate(llm, prompts, out_lens):
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in out_lens]
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


@torch.inference_mode()
def run_transformers(model_dir, warmup, workloads):
    """Same protocol as `run_tandem`, with batched `generate`."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    _hf_generate(model, *warmup)
    return [_measure(_hf_generate, model, prompts, out_lens) for prompts, out_lens in workloads]


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters


def keep_heap() -> str:
    """Make glibc keep freed memory for reuse: allocations up to 64 MiB come from the heap
    (not fresh mmaps), and up to 1 GiB of free heap top is kept rather than trimmed."""
    libc = ctypes.CDLL("libc.so.6")
    if not (libc.mallopt(M_MMAP_THRESHOLD, 64 << 20) and libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)):
        raise OSError("mallopt refused the heap settings")
    return "glibc, mmap threshold 64 MiB, trim threshold 1 GiB (both systems)"


def _measure(generate, *args):
    """(generate(*args), seconds, minor page faults taken meanwhile)."""
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.perf_counter()
    outs = generate(*args)
    elapsed = time.perf_counter() - start
    return outs, elapsed, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults


def _hf_generate(model, prompts, out_lens):
    width = max(map(len, prompts))
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):  # left padding
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    new = max(out_lens)
    out = model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=new,
        min_new_tokens=new,
        do_sample=False,
        pad_token_id=0,
    )
    return [out[i, width : width + m].tolist() for i, m in enumerate(out_lens)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="timed workloads per system")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--model", default=None, help="model folder (default: a random one)")
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--profile", action="store_true", help="pyinstrument Tandem's first")
    parser.add_argument(
        "--keep-heap", action="store_true", help="glibc keeps freed memory (both systems)"
    )
    parser.add_argument(
        "--kv-hugepages",
        action="store_true",
        help="Tandem's KV pool on reserved huge pages (2 GiB: sysctl vm.nr_hugepages=1024)",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="4 short requests on a tiny model, one workload"
    )
    args = parser.parse_args()
    malloc = keep_heap() if args.keep_heap else "glibc defaults"
    size, prompt_range, output_range = "small", (16, 512), (16, 256)
    if args.smoke:
        args.num_requests, args.repeats = 4, 1
        size, prompt_range, output_range = "tiny", (8, 32), (4, 8)
    torch.set_num_threads(args.threads)

    model_dir = args.model or make_model(Path(tempfile.mkdtemp()) / size, "llama", size)
    n_params = sum(t.numel() for t in _tensors(model_dir))
    vocab = ModelConfig.from_pretrained(model_dir).vocab_size
    # Timed workloads use seeds seed .. seed + repeats - 1. Both systems first serve one
    # more of the same shape (the next seed), so every timed run sees a warm process
    # (allocator grown, pages mapped); fresh prompts each time mean no prefix-cache hits.
    workloads = [
        requests(args.num_requests, args.seed + r, vocab, prompt_range, output_range)
        for r in range(args.repeats + 1)
    ]
    warmup, workloads = workloads[-1], workloads[:-1]
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(
        f"machine: {platform.node()} {platform.machine()} {os.cpu_count()} cpus, "
        f"torch {torch.__version__}, {args.threads} threads, malloc: {malloc}"
    )
    print(f"model: random llama, {n_params / 1e6:.1f}M parameters, float32, CPU")
    out_tokens = [sum(out_lens) for _, out_lens in workloads]
    for r, (prompts, _) in enumerate(workloads):
        print(
            f"workload {r}: {len(prompts)} requests, prompt tokens {sum(map(len, prompts))}, "
            f"output tokens {out_tokens[r]}"
        )

    ours = run_tandem(model_dir, warmup, workloads, args)
    _report("tandem", ours, out_tokens)
    if args.skip_transformers:
        return
    theirs = run_transformers(model_dir, warmup, workloads)
    _report("transformers", theirs, out_tokens)
    t_ours, t_hf = sum(r[1] for r in ours), sum(r[1] for r in theirs)
    each = ", ".join(f"{b[1] / a[1]:.2f}x" for a, b in zip(ours, theirs))
    print(f"ratio: {t_hf / t_ours:.2f}x over all workloads (each: {each})")
    pairs = [(a, b) for x, y in zip(ours, theirs) for a, b in zip(x[0], y[0])]
    same = sum(a == b for a, b in pairs)
    print(f"identical greedy outputs: {same}/{len(pairs)}")


def _report(name, results, out_tokens):
    total = sum(t for _, t, _ in results)
    times = ", ".join(f"{t:.2f}" for _, t, _ in results)
    faults = ", ".join(str(f) for _, _, f in results)
    print(
        f"{name + ':':14}{total:7.2f} s  {sum(out_tokens) / total:8.1f} output tok/s  "
        f"({times} s; page faults {faults})"
    )


def _tensors(model_dir):
    from safetensors.torch import load_file

    for f in Path(model_dir).glob("*.safetensors"):
        yield from load_file(str(f)).values()


if __name__ == "__main__":
    main()
