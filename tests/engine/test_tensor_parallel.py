"""Tensor parallelism on the CPU (gloo, 2 ranks): the same outputs as one rank, clear errors
for sizes that cannot split the model, and no rank process ever left behind.

Two ranks sum each row-parallel product and the vocabulary's embedding in another order than
one rank does, so logits differ by float32 rounding: bounded by `logit_rounding` (any order
of the model's sums), and greedy tokens compared with the near-tie guard of tests/greedy.py
(the one-rank run's top-2 log-probabilities tell how close each step's choice was).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from tandem.engine import LLM, SamplingParams
from tandem.engine.core.config import ModelConfig, check_tensor_parallel_size
from tandem.engine.core.request import Request
from tandem.engine.core.step_planner import StepPlanner
from tandem.engine.parallel import rank_main
from tandem.engine.parallel.rank_processes import RankStartupError
from tandem.engine.tiny_model import ARCHS
from tests.bounds import HANG_S, PROCESS_S
from tests.engine.test_parity import prompts
from tests.greedy import NEAR_TIE, assert_greedy_agrees, logit_rounding, logprob_gap

# Long prompts chunk under a 64-token budget; 16 blocks of 16 cannot hold them all at once.
PROMPT_LENS = [1, 17, 64, 150]
NUM_TOKENS = 16
ENGINE = {"dtype": "float32", "num_kv_blocks": 16, "max_num_batched_tokens": 64, "max_num_seqs": 8}


def _logits(llm: LLM, prompt: list[int]) -> torch.Tensor:
    """Every position's logits [T, V] of one forward pass over `prompt`, on every rank."""
    engine = llm.engine
    request = Request("logits", prompt, SamplingParams())
    assert engine.kv.allocate_slots(request, len(prompt)) is not None
    plan = StepPlanner(engine.kv).plan([request], [len(prompt)])
    runner = engine.runner
    batch, _ = runner._prepare(plan)
    batch.logits_indices = np.arange(len(prompt), dtype=np.int64)
    if runner.workers is not None:
        runner.workers.broadcast(batch)
    _, logits = runner.shard.forward(batch)
    engine.kv.free(request)
    return logits


def _process_gone(pid: int) -> bool:
    """No such process, or only its zombie (exited, not reaped by whoever adopted it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def _wait_gone(pids: list[int]) -> None:
    deadline = time.monotonic() + HANG_S
    while not all(_process_gone(p) for p in pids):
        assert time.monotonic() < deadline, f"rank processes {pids} still alive"
        time.sleep(0.05)


@pytest.mark.parametrize("arch", ARCHS)
def test_two_ranks_match_one(model_dirs, arch):
    one = LLM(str(model_dirs[arch]), kernels="torch", **ENGINE)
    with LLM(str(model_dirs[arch]), kernels="torch", tensor_parallel_size=2, **ENGINE) as two:
        workers = two.engine.runner.workers.processes
        _match_one(one, two, arch)
    assert two.engine.runner.workers is None
    assert [p.exitcode for p in workers] == [0]


def _match_one(one: LLM, two: LLM, arch: str) -> None:
    assert two.engine.runner.kv_cache.shape[-2] == one.engine.runner.kv_cache.shape[-2] // 2

    prompt = prompts(one.engine.config.model.vocab_size)[6]  # 180 tokens
    want, got = _logits(one, prompt), _logits(two, prompt)
    atol = logit_rounding(len(prompt), scale=want.abs().max().item())
    torch.testing.assert_close(got, want, rtol=0, atol=atol)

    batch = prompts(one.engine.config.model.vocab_size, PROMPT_LENS)
    outs = _greedy_outputs((one, two), batch, NUM_TOKENS)
    for llm in (one, two):
        assert llm.engine.scheduler.num_preemptions > 0  # the pool was too small for all
        assert llm.engine.check_integrity().in_use == 0
    _assert_agree(batch, outs, arch)


def _greedy_outputs(llms: tuple[LLM, LLM], batch: list[list[int]], num_tokens: int) -> list:
    """Each engine's greedy outputs of `num_tokens` for `batch`, with top-2 log-probs."""
    params = SamplingParams(temperature=0, max_tokens=num_tokens, min_tokens=num_tokens, logprobs=2)
    return [
        llm.generate(prompt_token_ids=batch, sampling_params=params, use_tqdm=False) for llm in llms
    ]


def _assert_agree(batch: list[list[int]], outs: list, label: str) -> None:
    """Two ranks' tokens (outs[1]) against one rank's (outs[0]), near ties excepted."""
    for prompt, ref, ours in zip(batch, *outs):
        assert_greedy_agrees(
            ours.outputs[0].token_ids,
            ref.outputs[0].token_ids,
            logprob_gap(ref.outputs[0]),
            f"{label}, prompt of {len(prompt)} tokens",
        )


def test_a_size_that_does_not_split_the_heads_is_refused(llama_dir):
    with pytest.raises(ValueError, match="tensor_parallel_size 3 does not divide the model's 4"):
        LLM(str(llama_dir), num_kv_blocks=8, tensor_parallel_size=3)
    model = ModelConfig.from_pretrained(llama_dir)
    odd_kv = dataclasses.replace(model, num_heads=12, num_kv_heads=6)
    with pytest.raises(ValueError, match="6 key-value heads"):
        check_tensor_parallel_size(odd_kv, 4)
    check_tensor_parallel_size(model, 4)  # 2 KV heads, each on 2 of the 4 ranks


def test_more_ranks_than_gpus_is_refused(llama_dir):
    visible = torch.cuda.device_count()
    size = 2 if visible < 2 else 4  # the tiny model splits 2 or 4 ways
    if visible >= size:
        pytest.skip(f"{visible} GPUs hold {size} ranks")
    with pytest.raises(ValueError, match=f"size {size} needs as many GPUs, but {visible} are"):
        LLM(str(llama_dir), device="cuda", num_kv_blocks=8, tensor_parallel_size=size)


def _rank_two_dies(config, rank, conn, lifeline, num_threads) -> None:
    """A rank main for the test below: rank 2 dies starting, the others run the real rank."""
    if rank == 2:
        os._exit(3)
    rank_main.run_rank(config, rank, conn, lifeline, num_threads)


def test_a_rank_dying_at_start_up_is_named_and_every_rank_stopped(llama_dir, monkeypatch):
    monkeypatch.setattr(rank_main, "run_rank", _rank_two_dies)
    with pytest.raises(RankStartupError, match=r"rank 2 \(pid \d+\) exited with code 3") as e:
        LLM(str(llama_dir), num_kv_blocks=8, kernels="torch", tensor_parallel_size=4)
    assert len(e.value.pids) == 3  # ranks 1, 2 and 3
    assert f"(pid {e.value.pids[1]})" in str(e.value)
    # Gone, not orphaned: the engine killed and reaped ranks 1 and 3 before raising.
    assert all(_process_gone(pid) for pid in e.value.pids)


_ORPHAN_SCRIPT = """
import sys, time
from tandem.engine import LLM
if __name__ == "__main__":
    llm = LLM(sys.argv[1], num_kv_blocks=8, kernels="torch", tensor_parallel_size=2)
    print(*llm.engine.runner.workers.pids, flush=True)
    time.sleep(10**6)
"""


def test_ranks_die_with_the_engine_process(llama_dir, tmp_path):
    script = tmp_path / "engine.py"
    script.write_text(_ORPHAN_SCRIPT)
    engine = subprocess.Popen(
        [sys.executable, "-P", str(script), str(llama_dir)], stdout=subprocess.PIPE, text=True
    )
    try:
        line = engine.stdout.readline()  # once the ranks are ready
        pids = [int(p) for p in line.split()]
        assert len(pids) == 1 and not _process_gone(pids[0])
        engine.send_signal(signal.SIGKILL)
        engine.wait(PROCESS_S)
        _wait_gone(pids)
    finally:
        engine.kill()
        engine.wait(PROCESS_S)


def test_generate_command_runs_two_ranks(llama_dir, llm):
    """`tandem generate --tensor-parallel-size 2` prints what one rank prints (this prompt
    has no near-tie in its 8 greedy steps, so the texts must be equal)."""
    greedy = SamplingParams(temperature=0, max_tokens=8, logprobs=2)
    ref = llm.generate("the cat", greedy, use_tqdm=False)
    assert all(lp.top[0][1] - lp.top[1][1] > NEAR_TIE for lp in ref[0].outputs[0].logprobs)
    command = [sys.executable, "-P", "-m", "tandem.cli", "generate", "--model",
               str(llama_dir), "--dtype", "float32", "--max-tokens", "8", "the cat"]  # fmt: skip
    outputs = [
        subprocess.run(
            [*command, "--tensor-parallel-size", size],
            capture_output=True,
            text=True,
            timeout=PROCESS_S,
            check=True,
        ).stdout
        for size in ("1", "2")
    ]
    assert outputs[0].startswith("'the cat' -> ")
    assert outputs[1] == outputs[0]


def test_two_ranks_through_the_triton_kernels(llama_dir):
    """The Triton path with two ranks (the CPU interpreter here): each rank's attention
    backend over its own heads, and the decode buckets' static buffers in every rank."""
    kwargs = {
        "kernels": "triton",
        "dtype": "float32",
        "block_size": 4,
        "num_kv_blocks": 24,
        "max_num_seqs": 4,
    }
    one = LLM(str(llama_dir), **kwargs)
    with LLM(str(llama_dir), tensor_parallel_size=2, **kwargs) as two:
        assert two.engine.runner.graphs is not None
        batch = prompts(one.engine.config.model.vocab_size, [3, 17, 40])
        _assert_agree(batch, _greedy_outputs((one, two), batch, 6), "triton")


def test_a_step_failing_on_rank_0_stops_the_ranks_and_later_steps_are_refused(llama_dir):
    """Rank 0 fails after the others started the step (they wait in its collectives): the
    ranks are stopped, never fed a next step that would pair with the old collectives."""
    with LLM(str(llama_dir), kernels="torch", tensor_parallel_size=2, **ENGINE) as llm:
        runner = llm.engine.runner
        workers = runner.workers.processes
        forward = runner.shard.forward

        def fails(batch):
            raise MemoryError("rank 0 only")

        runner.shard.forward = fails
        params = SamplingParams(temperature=0, max_tokens=4)
        with pytest.raises(MemoryError, match="rank 0 only"):
            llm.generate(prompt_token_ids=[[1, 2, 3]], sampling_params=params, use_tqdm=False)
        assert runner.workers is None
        _wait_gone([p.pid for p in workers])
        runner.shard.forward = forward
        with pytest.raises(RuntimeError, match="ranks were stopped: a step failed on rank 0"):
            llm.generate(prompt_token_ids=[[1, 2, 3]], sampling_params=params, use_tqdm=False)
