"""The offline API end to end on a real (tiny) model."""

from __future__ import annotations

import pytest

from tandem.engine import LLM, SamplingParams
from tandem.engine.tiny_model import CHAT_TEMPLATE


@pytest.fixture(autouse=True)
def no_leaks(llm):
    yield
    assert not llm.engine.has_unfinished_requests()
    assert llm.engine.check_integrity().in_use == 0


def test_outputs_come_back_in_input_order(llm):
    prompts = ["a " * 40, "b", "cache block " * 5]
    params = [SamplingParams(max_tokens=m, temperature=0, ignore_eos=True) for m in (3, 9, 5)]
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.prompt for o in outs] == prompts
    assert [len(o.outputs[0].token_ids) for o in outs] == [3, 9, 5]
    assert all(o.outputs[0].finish_reason == "length" for o in outs)
    assert outs[1].prompt_token_ids == llm.tokenizer.encode("b")


def test_text_is_the_decode_of_the_tokens(llm):
    out = llm.generate("Hello", SamplingParams(max_tokens=20, temperature=0), use_tqdm=False)[0]
    completion = out.outputs[0]
    ids = completion.token_ids
    if completion.finish_reason == "stop":
        ids = ids[:-1]
    assert completion.text == llm.tokenizer.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (dict(max_tokens=0), "max_tokens must be at least 1"),
        (dict(temperature=-0.5), "temperature must be at least 0"),
        (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
        (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
        (dict(n=0), "n must be at least 1"),
        (dict(min_tokens=5, max_tokens=2), "min_tokens"),
    ],
)
def test_bad_sampling_params_are_value_errors(params, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**params)


def test_bad_prompts_are_refused_before_anything_is_queued(llm):
    too_long = [5] * (llm.engine.config.scheduler.max_model_len + 1)
    good = [5, 6, 7]
    with pytest.raises(ValueError, match="more than max_model_len"):
        llm.generate(prompt_token_ids=[good, too_long], use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()
    with pytest.raises(ValueError, match="empty"):
        llm.generate(prompt_token_ids=[[]], use_tqdm=False)
    with pytest.raises(ValueError, match="token ids must be in"):
        llm.generate(prompt_token_ids=[[10**6]], use_tqdm=False)
    with pytest.raises(ValueError, match="2 sampling params for 1 prompts"):
        llm.generate(["x"], [SamplingParams(), SamplingParams()], use_tqdm=False)
    # ...and the engine goes on serving.
    out = llm.generate(prompt_token_ids=[good], sampling_params=SamplingParams(max_tokens=2))
    assert len(out[0].outputs[0].token_ids) >= 1


def test_a_sequence_that_can_never_fit_the_pool_is_refused(llama_dir):
    small = LLM(str(llama_dir), num_kv_blocks=4, block_size=16)
    with pytest.raises(ValueError, match="needs 5 KV blocks but the cache has only 4"):
        small.generate(prompt_token_ids=[[5] * 70], sampling_params=SamplingParams(max_tokens=1))


def test_a_pool_larger_than_the_machine_is_refused_before_it_is_built(llama_dir):
    with pytest.raises(ValueError, match=r"num_kv_blocks=1000000000000: a KV cache of .* GiB"):
        LLM(str(llama_dir), num_kv_blocks=10**12)  # a pool of 10**12 blocks would never end


def test_unknown_model_folder_is_an_os_error(tmp_path):
    with pytest.raises(OSError, match=r"no config\.json"):
        LLM(str(tmp_path))


def test_n_copies_share_the_prompt_blocks_and_differ(llm):
    prompt = [7] * 64  # four full blocks
    # past the first token: the tiny model gives its EOS 78% there, so four copies stopped
    # at it would be alike
    params = SamplingParams(n=4, max_tokens=8, temperature=1.0, seed=11, ignore_eos=True)
    stats = llm.engine.kv.stats
    queries_before, hits_before = stats.queries, stats.hits
    out = llm.generate(prompt_token_ids=[prompt], sampling_params=params, use_tqdm=False)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2, 3]
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1
    # copies 1..3 each reuse the three full blocks copy 0 published (the last is recomputed)
    assert stats.queries - queries_before == 4 * 64
    assert stats.hits - hits_before == 3 * 48


def test_seeded_sampling_is_reproducible_whatever_the_batch(llm):
    params = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, seed=1234)
    alone = llm.generate("The model", params, use_tqdm=False)[0].outputs[0].token_ids
    crowd = ["x " * 30, "The model", "paged memory"]
    noisy = [
        SamplingParams(max_tokens=20, temperature=1.3, seed=1),
        params,
        SamplingParams(max_tokens=5),
    ]
    batched = llm.generate(crowd, noisy, use_tqdm=False)[1].outputs[0].token_ids
    assert alone == batched


def test_preempted_sampled_request_yields_the_same_tokens(llama_dir):
    params = [
        SamplingParams(max_tokens=40, temperature=1.0, seed=s, ignore_eos=True) for s in range(6)
    ]
    prompts = [[5 + i] * (20 + 7 * i) for i in range(6)]
    roomy = LLM(str(llama_dir), dtype="float32", num_kv_blocks=64)
    tight = LLM(str(llama_dir), dtype="float32", num_kv_blocks=12, max_num_batched_tokens=32)
    expected = roomy.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    got = tight.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    assert tight.engine.scheduler.num_preemptions > 0
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in expected]
    assert tight.engine.check_integrity().in_use == 0


def test_stop_string_ends_generation_and_is_not_in_the_text(llm):
    free = llm.generate(
        "Hello", SamplingParams(max_tokens=30, temperature=0, ignore_eos=True), use_tqdm=False
    )[0].outputs[0]
    cut = 5
    while cut < len(free.text) and not free.text[cut].strip():
        cut += 1
    stop = free.text[cut : cut + 2]
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True, stop=[stop])
    stopped = llm.generate("Hello", params, use_tqdm=False)[0].outputs[0]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == stop
    assert stopped.text == free.text[: free.text.index(stop)]
    assert len(stopped.token_ids) < len(free.token_ids)


def test_stop_token_ids_and_min_tokens(llm):
    free = llm.generate(
        "Hi", SamplingParams(max_tokens=10, temperature=0, ignore_eos=True), use_tqdm=False
    )[0].outputs[0]
    stop_id = free.token_ids[3]
    first = free.token_ids.index(stop_id)
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, stop_token_ids=[stop_id])
    out = llm.generate("Hi", params, use_tqdm=False)[0].outputs[0]
    assert out.token_ids == free.token_ids[: first + 1]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop_id)
    late = SamplingParams(
        max_tokens=10,
        temperature=0,
        ignore_eos=True,
        stop_token_ids=[stop_id],
        min_tokens=first + 2,
    )
    out = llm.generate("Hi", late, use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) >= first + 2
    assert stop_id not in out.token_ids[: first + 2]


def test_logprobs_through_the_api(llm):
    params = SamplingParams(max_tokens=4, temperature=0, logprobs=2)
    completion = llm.generate("Hi", params, use_tqdm=False)[0].outputs[0]
    assert len(completion.logprobs) == len(completion.token_ids)
    for token, lp in zip(completion.token_ids, completion.logprobs):
        assert lp.token_id == token and lp.rank == 1 and lp.logprob <= 0
        assert len(lp.top) == 2 and lp.top[0][0] == token
    assert completion.cumulative_logprob == pytest.approx(
        sum(lp.logprob for lp in completion.logprobs)
    )


def test_chat_uses_the_template(llm):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    params = SamplingParams(max_tokens=4, temperature=0)
    out = llm.chat(messages, params, use_tqdm=False)
    assert len(out) == 1
    rendered = llm.tokenizer.apply_chat_template(
        messages, chat_template=CHAT_TEMPLATE, add_generation_prompt=True, tokenize=False
    )
    assert out[0].prompt_token_ids == llm.tokenizer.encode(rendered)
    both = llm.chat([messages, messages[1:]], params, use_tqdm=False)
    assert len(both) == 2 and both[0].outputs[0].token_ids == out[0].outputs[0].token_ids


def test_abort_frees_everything(llm):
    engine = llm.engine
    for i in range(4):
        engine.add_request(f"abort-{i}", [5] * (10 + 20 * i), SamplingParams(max_tokens=50))
    engine.step()
    engine.step()
    outs = engine.abort_request([f"abort-{i}" for i in range(4)])
    assert sorted(o.request_id for o in outs) == [f"abort-{i}" for i in range(4)]
    assert all(o.outputs[0].finish_reason == "abort" for o in outs)
    engine.add_request("dup", [5], SamplingParams())
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("dup", [5], SamplingParams())
    engine.abort_request(["dup"])


def test_non_string_prompts_are_refused(llm):
    with pytest.raises(TypeError, match="prompt_token_ids"):
        llm.generate({"prompt_token_ids": [5, 6, 7]}, use_tqdm=False)


def test_an_id_taken_by_a_copy_of_another_request_is_refused_with_nothing_changed(llm):
    """ "a" with n=2 runs as "a#0" and "a#1": a request of its own named "a#0" (or an n > 1
    request whose copy would take a running request's id) must not queue half-way and then
    steal the copy's output."""
    engine = llm.engine
    engine.add_request("a", [5, 6, 7], SamplingParams(n=2, max_tokens=3))
    engine.add_request("b#1", [5, 6], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="'a#0' is already in use"):
        engine.add_request("a#0", [5, 6], SamplingParams(max_tokens=3))
    with pytest.raises(ValueError, match="'b#1' is already in use"):
        engine.add_request("b", [5, 6], SamplingParams(n=2, max_tokens=3))
    assert sorted(engine.outputs.parent_ids()) == ["a", "b#1"]
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    by_id = {o.request_id: o for o in outputs}
    assert sorted(by_id) == ["a", "b#1"]
    assert len(by_id["a"].outputs) == 2 and all(len(c.token_ids) == 3 for c in by_id["a"].outputs)
    assert engine.check_integrity().in_use == 0
