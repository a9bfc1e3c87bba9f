"""The plan the scheduler hands the model runner: plain data only, each request in full once
and then as diffs, the runner's copies dropped when their requests end or are preempted,
and rebuilt in full (same tokens) when a preempted request resumes."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from tandem.engine import LLM, SamplingParams
from tandem.engine.core.config import SchedulerConfig
from tandem.engine.core.kv_cache_manager import KVCacheManager
from tandem.engine.core.request import Request, RequestStatus
from tandem.engine.core.scheduler import ModelRunnerOutput, Scheduler
from tandem.engine.core.step_plan import (
    CachedRequestData,
    GrammarBitmask,
    NewRequestData,
    StepPlan,
)
from tandem.engine.exec.request_state import RequestStates
from tandem.engine.exec.sampler import Sampler
from tandem.engine.structured.spec import StructuredOutputsParams

PLAIN_LEAVES = (str, int, float, bool, type(None))
PLAIN_RECORDS = (
    StepPlan,
    NewRequestData,
    CachedRequestData,
    GrammarBitmask,
    SamplingParams,
    StructuredOutputsParams,
)


def assert_plain(obj: object, path: str = "plan") -> None:
    """Every object reachable from `obj` is a plain leaf, a container of them, a numpy array
    of numbers, or one of the plain records (walked field by field)."""
    if isinstance(obj, PLAIN_LEAVES):
        return
    if isinstance(obj, np.ndarray):
        assert obj.dtype.kind in "biuf", f"{path}: array of {obj.dtype}"
        return
    if isinstance(obj, (list, tuple, set, frozenset)):
        for i, item in enumerate(obj):
            assert_plain(item, f"{path}[{i}]")
        return
    if isinstance(obj, dict):
        for key, value in obj.items():
            assert_plain(key, f"{path} key")
            assert_plain(value, f"{path}[{key!r}]")
        return
    assert type(obj) in PLAIN_RECORDS, f"{path}: {type(obj).__name__} is not plain data"
    for f in dataclasses.fields(obj):
        assert_plain(getattr(obj, f.name), f"{path}.{f.name}")


def record_plans(llm: LLM, tables: dict[str, list[list[int]]] | None = None) -> list[StepPlan]:
    """Every plan the engine's runner receives from now on, in order; and in `tables`, each
    scheduled request's block table as each plan is run."""
    engine, runner = llm.engine, llm.engine.runner
    plans: list[StepPlan] = []
    execute = runner.execute

    def recording(plan):
        plans.append(plan)
        for rid in plan.req_ids if tables is not None else ():
            tables.setdefault(rid, []).append(list(engine.kv.block_ids(rid)))
        return execute(plan)

    runner.execute = recording
    return plans


def assert_runner_mirrors_the_scheduler(llm: LLM) -> None:
    """The runner's copy of each running request has its tokens and its block table."""
    engine = llm.engine
    for request in engine.scheduler.running:
        state = engine.runner.requests[request.request_id]
        assert state.all_token_ids == request.all_token_ids
        assert state.output_token_ids == request.output_token_ids
        assert state.block_ids == engine.kv.block_ids(request.request_id)


def test_the_runner_receives_only_plain_data(llama_dir):
    """Preemptions, prefix hits, seeded sampling and a grammar: no `Request`, generator or
    matcher ever reaches the runner."""
    llm = LLM(str(llama_dir), num_kv_blocks=12, max_num_batched_tokens=32)
    plans = record_plans(llm)
    spec = StructuredOutputsParams(regex="[a-z]{3,12}")
    params = [
        SamplingParams(max_tokens=40, temperature=0.8, seed=s, ignore_eos=True) for s in range(5)
    ]
    params.append(SamplingParams(max_tokens=40, seed=9, structured_outputs=spec))
    prompts = [[5 + i % 3] * (20 + 7 * i) for i in range(6)]
    llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    assert llm.engine.scheduler.num_preemptions > 0
    assert any(p.grammar_bitmask is not None for p in plans)
    for plan in plans:
        assert type(plan) is StepPlan
        assert_plain(plan)


def test_a_known_request_receives_only_its_new_blocks_and_counts(llama_dir):
    """Chunked prefill, then decode: the first plan sends the request in full, each later one
    only the blocks added since (and no token: the runner appends what it samples)."""
    llm = LLM(str(llama_dir), num_kv_blocks=32, block_size=4, max_num_batched_tokens=8)
    by_request: dict[str, list[list[int]]] = {}
    plans = record_plans(llm, by_request)
    engine = llm.engine
    prompt = list(range(10, 30))  # 20 tokens: 3 chunks of 8
    params = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True)
    engine.add_request("r", prompt, params)
    while engine.has_unfinished_requests():
        engine.step()
        assert_runner_mirrors_the_scheduler(llm)
    tables = by_request["r"]
    first, *rest = plans
    (new,) = first.new_reqs
    assert new.token_ids == prompt and new.num_computed_tokens == 0
    assert new.block_ids == tables[0] and len(new.block_ids) == 2  # the first 8 tokens
    received = list(new.block_ids)
    for plan, table, before in zip(rest, tables[1:], tables):
        assert plan.new_reqs == [] and plan.cached_reqs.req_ids == ["r"]
        assert plan.cached_reqs.new_token_ids == {}
        new_blocks = plan.cached_reqs.new_block_ids.get("r", [])
        assert new_blocks == table[len(before) :] and len(new_blocks) <= 2
        received += new_blocks
    assert received == tables[-1] and len(received) == (20 + 14 - 1 + 3) // 4
    assert [p.cached_reqs.num_computed_tokens[0] for p in rest[:2]] == [8, 16]
    assert [p.cached_reqs.num_computed_tokens[0] for p in rest[2:]] == list(range(20, 33))


def test_the_runner_drops_what_ends(llama_dir):
    """Finished and aborted requests leave the runner at its next step: many requests later
    it holds no more than the batch it runs."""
    llm = LLM(str(llama_dir), num_kv_blocks=64, max_num_seqs=4)
    plans = record_plans(llm)
    engine, runner = llm.engine, llm.engine.runner
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    for round_ in range(5):
        prompts = [[7 + round_, 8 + i] for i in range(10)]
        llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
        assert len(runner.requests) <= 4
    engine.add_request("gone", [3, 4, 5], SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    assert "gone" in runner.requests
    engine.abort_request(["gone"])
    (out,) = llm.generate(prompt_token_ids=[[9, 9]], sampling_params=params, use_tqdm=False)
    assert "gone" in plans[-len(out.outputs[0].token_ids)].finished_req_ids
    assert len(runner.requests) == 1 and engine.scheduler.planner.num_held == 0
    dropped = [rid for p in plans for rid in p.finished_req_ids]
    assert len(dropped) == len(set(dropped)) == 50 + 1  # each once; the last one waits


def test_preemption_drops_the_copy_and_resumption_resends_it_in_full(llama_dir):
    """Greedy tokens are those of a pool large enough for all; a resumed request comes back
    with its prompt and the tokens it had, and its whole block table."""
    prompts = [[5 + i] * (20 + 7 * i) for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    # float32: in bf16 a sequence decoding alone (fused SDPA) and in a group (batched
    # matmuls) rounds differently, and greedy tokens of a random model follow the rounding
    roomy = LLM(str(llama_dir), num_kv_blocks=64, dtype="float32")
    tight = LLM(str(llama_dir), num_kv_blocks=12, max_num_batched_tokens=32, dtype="float32")
    plans = record_plans(tight)
    expected = roomy.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    got = tight.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in expected]
    outputs = {str(i): o.outputs[0].token_ids for i, o in enumerate(got)}
    preempted = {rid for p in plans for rid in p.preempted_req_ids}
    assert preempted and tight.engine.scheduler.num_preemptions >= len(preempted)
    resent = 0
    for step, plan in enumerate(plans):
        for rid in plan.preempted_req_ids:
            assert rid not in plan.req_ids
            later = next(p for p in plans[step + 1 :] if rid in p.req_ids)
            (again,) = [d for d in later.new_reqs if d.request_id == rid]
            prompt = prompts[int(rid)]
            num_out = len(again.token_ids) - len(prompt)
            assert again.token_ids == prompt + outputs[rid][:num_out]
            assert again.num_prompt_tokens == len(prompt)
            resent += num_out > 0
    assert resent > 0  # some came back with tokens they had produced


def test_tokens_appended_outside_the_runner_travel_as_a_diff():
    """A token the scheduler's side appends (not one the runner sampled) reaches the
    runner's copy through the next plan; the runner's own samples never travel back."""
    kv = KVCacheManager(block_size=4, num_blocks=16)
    scheduler = Scheduler(SchedulerConfig(16, 4, 64), kv)
    runner = RequestStates(torch.device("cpu"))
    request = Request("r", [1, 2, 3, 4, 5], SamplingParams(temperature=0, max_tokens=9))
    scheduler.add_request(request)

    def run_step(sampled: int) -> StepPlan:
        out = scheduler.schedule()
        (state,) = runner.update(out.plan)
        state.append_token(sampled)
        scheduler.update_from_output(out, ModelRunnerOutput([sampled], [None]))
        return out.plan

    run_step(6)
    assert run_step(7).cached_reqs.new_token_ids == {}
    request.append_output_token(8)  # as a prefill node's first token is
    plan = run_step(9)
    assert plan.cached_reqs.new_token_ids == {"r": [8]}
    assert runner["r"].all_token_ids == request.all_token_ids == [1, 2, 3, 4, 5, 6, 7, 8, 9]


class TinyEngine:
    """A scheduler and the runner's request states, stepped with a fake model that samples
    token 5: the plan's contract without a model."""

    def __init__(self, num_blocks: int) -> None:
        kv = KVCacheManager(block_size=4, num_blocks=num_blocks)
        self.scheduler = Scheduler(SchedulerConfig(16, 4, 64), kv)
        self.runner = RequestStates(torch.device("cpu"))

    def add(self, request_id: str, seed: int) -> Request:
        params = SamplingParams(temperature=1.0, seed=seed, max_tokens=8, ignore_eos=True)
        request = Request(request_id, [1 + seed] * 8, params)
        request.seed = seed
        self.scheduler.add_request(request)
        return request

    def step(self) -> StepPlan:
        out = self.scheduler.schedule()
        states = self.runner.update(out.plan)
        tokens: list[int | None] = []
        for state, n in zip(states, out.plan.num_scheduled_tokens):
            due = state.num_computed_tokens + n == state.num_tokens
            tokens.append(5 if due else None)
            if due:
                state.append_token(5)
        self.scheduler.update_from_output(out, ModelRunnerOutput(tokens, [None] * len(tokens)))
        return out.plan


def test_a_preempted_request_s_generator_waits_for_it_to_resume():
    """Two requests of 4 blocks each in a pool of 5: the second is preempted at its first
    decode step and resumes, sent in full, with the very generator it had."""
    engine = TinyEngine(num_blocks=5)
    engine.add("a", seed=1)
    b = engine.add("b", seed=2)
    engine.step()
    generator = engine.runner["b"].generator
    assert engine.step().preempted_req_ids == ["b"]
    assert "b" not in engine.runner and engine.runner.num_parked == 1
    while "b" not in engine.runner:
        plan = engine.step()
    (again,) = plan.new_reqs
    assert again.request_id == "b" and again.token_ids == b.all_token_ids[: len(again.token_ids)]
    assert engine.runner["b"].generator is generator and engine.runner.num_parked == 0


def test_a_preempted_request_that_ends_while_waiting_frees_its_generator():
    engine = TinyEngine(num_blocks=5)
    engine.add("a", seed=1)
    engine.add("b", seed=2)
    engine.step()
    assert engine.step().preempted_req_ids == ["b"] and engine.runner.num_parked == 1
    engine.scheduler.finish_requests(["b"], RequestStatus.FINISHED_ABORTED)
    assert engine.step().finished_req_ids == ["b"]
    assert engine.runner.num_parked == 0 and len(engine.runner) == 1


def test_a_rebuilt_generator_continues_the_draws():
    """A request's copy made with k output tokens draws what the first copy draws after
    sampling k tokens itself: its draws depend on its seed and output count alone."""
    vocab = 40
    states = RequestStates(torch.device("cpu"))
    params = SamplingParams(temperature=1.0, seed=3)
    data = NewRequestData("a", [1, 2], 2, params, (), 3, [0], 2)
    first = states.update(StepPlan(req_ids=["a"], num_scheduled_tokens=[1], new_reqs=[data]))
    sampler = Sampler()
    logits = torch.randn(6, vocab, generator=torch.Generator().manual_seed(0)) * 3
    drawn = []
    for row in range(6):
        (token,) = sampler(logits[row : row + 1], first).token_ids
        first[0].append_token(token)
        drawn.append(token)
    resumed = NewRequestData("b", [1, 2, *drawn[:4]], 2, params, (), 3, [0, 1], 6)
    second = states.update(StepPlan(req_ids=["b"], num_scheduled_tokens=[1], new_reqs=[resumed]))
    again = [sampler(logits[row : row + 1], second).token_ids[0] for row in (4, 5)]
    assert again == drawn[4:]


def test_a_request_preempted_by_an_empty_step_and_ended_is_dropped_once():
    """The lone running request cannot grow and preempts itself: nothing is scheduled, so
    the runner hears of the preemption only with the next batch. It ends before then (an
    abort, a prefill job's deadline): that batch tells the runner it finished, and not
    also that it was preempted (which the runner would look up after dropping it)."""
    engine = TinyEngine(num_blocks=3)
    engine.add("a", seed=1)  # 8 prompt tokens in 2 blocks; a 4th block at its 13th token
    plan = engine.step()
    while engine.scheduler.num_preemptions == 0:
        plan = engine.step()
    assert plan.req_ids == [] and plan.preempted_req_ids == []  # the drop waits
    engine.scheduler.finish_requests(["a"], RequestStatus.FINISHED_ABORTED)
    engine.add("b", seed=2)
    plan = engine.step()
    assert plan.finished_req_ids == ["a"] and plan.preempted_req_ids == []
    assert "a" not in engine.runner and engine.runner.num_parked == 0
    assert engine.scheduler.planner.num_held == len(engine.runner) == 1
