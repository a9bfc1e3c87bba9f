"""Offline throughput: Tandem's engine against transformers' batched `generate`.

Same random Llama-shaped checkpoint, same requests (fixed seed), greedy, EOS ignored so
every request produces exactly its output length. Useful output tokens per second for both,
and their ratio. transformers runs the batch statically: every sequence is padded to the
longest prompt and decodes until the longest output, which is how it serves a batch.

    python bench/offline.py [--num-requests 64] [--threads 2] [--profile]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

from tandem.engine import LLM, SamplingParams
from tandem.engine.config import ModelConfig
from tandem.engine.tiny_model import make_model


def requests(n: int, seed: int, vocab: int, prompt_range, output_range):
    rng = random.Random(seed)
    prompts = [
        [rng.randrange(5, vocab) for _ in range(rng.randint(*prompt_range))] for _ in range(n)
    ]
    outputs = [rng.randint(*output_range) for _ in range(n)]
    return prompts, outputs


def run_tandem(model_dir, prompts, out_lens, warmup, args):
    llm = LLM(
        str(model_dir),
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
    )
    warm_prompts, warm_lens = warmup
    warm_params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in warm_lens]
    llm.generate(prompt_token_ids=warm_prompts, sampling_params=warm_params, use_tqdm=False)
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in out_lens]
    profiler = None
    if args.profile:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.0005)
        profiler.start()
    start = time.perf_counter()
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    if profiler is not None:
        profiler.stop()
        print(profiler.output_text(unicode=False, color=False, show_all=False))
    return [o.outputs[0].token_ids for o in outs], elapsed


@torch.inference_mode()
def run_transformers(model_dir, prompts, out_lens, warmup):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    _hf_generate(model, *warmup)
    start = time.perf_counter()
    out, width = _hf_generate(model, prompts, out_lens)
    elapsed = time.perf_counter() - start
    return [out[i, width : width + m].tolist() for i, m in enumerate(out_lens)], elapsed


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
    return out, width


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--model", default=None, help="model folder (default: a random one)")
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--profile", action="store_true", help="pyinstrument the Tandem run")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model_dir = args.model or make_model(Path(tempfile.mkdtemp()) / "small", "llama", "small")
    n_params = sum(t.numel() for t in _tensors(model_dir))
    vocab = ModelConfig.from_pretrained(model_dir).vocab_size
    prompts, out_lens = requests(args.num_requests, args.seed, vocab, (16, 512), (16, 256))
    # Both systems first serve a workload of the same shape drawn with another seed, so the
    # timed run sees a warm process (allocator grown, pages mapped) and no prefix-cache hits.
    warmup = requests(args.num_requests, args.seed + 1, vocab, (16, 512), (16, 256))
    total_out = sum(out_lens)
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(
        f"machine: {platform.node()} {platform.machine()} {os.cpu_count()} cpus, "
        f"torch {torch.__version__}, {args.threads} threads"
    )
    print(f"model: random llama, {n_params / 1e6:.1f}M parameters, float32, CPU")
    print(
        f"requests: {len(prompts)}, prompt tokens {sum(map(len, prompts))}, "
        f"output tokens {total_out}"
    )

    ours, t_ours = run_tandem(model_dir, prompts, out_lens, warmup, args)
    print(f"tandem:       {t_ours:7.2f} s  {total_out / t_ours:8.1f} output tok/s")
    if args.skip_transformers:
        return
    theirs, t_hf = run_transformers(model_dir, prompts, out_lens, warmup)
    print(f"transformers: {t_hf:7.2f} s  {total_out / t_hf:8.1f} output tok/s")
    print(f"ratio: {t_hf / t_ours:.2f}x")
    same = sum(a == b for a, b in zip(ours, theirs))
    print(f"identical greedy outputs: {same}/{len(ours)}")


def _tensors(model_dir):
    from safetensors.torch import load_file

    for f in Path(model_dir).glob("*.safetensors"):
        yield from load_file(str(f)).values()


if __name__ == "__main__":
    main()
