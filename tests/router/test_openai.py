"""The official `openai` client against a real `tandem serve` (router, prefill and decode
processes; real HTTP, ZMQ and NIXL), compared with the offline engine on the same model."""

from __future__ import annotations

import math

import httpx
import openai
import pytest

from tandem.engine.core.block_hash import hash_blocks
from tandem.engine.core.sampling_params import SamplingParams
from tandem.engine.tokenizer import encode_chat
from tests.bounds import HANG_S
from tests.disagg.nodes import metric_value, wait_until
from tests.greedy import LOGIT_ROUNDING, assert_well_separated
from tests.router.conftest import NODE_HEADERS

MODEL = "llama"  # the fixture's folder name is the served model id
PROMPTS = ["The quick brown fox", "Once upon a time in a land far away, there lived"]


@pytest.fixture(scope="module")
def client(serve):
    return openai.OpenAI(base_url=f"{serve.url}/v1", api_key="unused", max_retries=0)


def offline(llm, prompt, **params):
    """The offline engine's completions. The router's reach a node that batches and caches
    prefixes otherwise, so their logits differ by rounding: greedy ones are compared exactly
    only where every step is well clear of a near-tie, which is checked here."""
    greedy = params.get("temperature") == 0
    if greedy:
        params = {**params, "logprobs": max(2, params.get("logprobs") or 0)}
    outputs = llm.generate(prompt, SamplingParams(**params), use_tqdm=False)[0].outputs
    for output in outputs if greedy else ():
        assert_well_separated(output, f"{prompt!r}, {params}")
    return outputs


def test_completions_match_the_offline_engine(client, llm, tokenizer):
    r = client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=20, temperature=0)
    expected = [offline(llm, p, max_tokens=20, temperature=0)[0] for p in PROMPTS]
    assert [c.text for c in sorted(r.choices, key=lambda c: c.index)] == [e.text for e in expected]
    assert r.object == "text_completion" and r.model == MODEL and r.id.startswith("cmpl-")
    assert r.usage.prompt_tokens == sum(len(tokenizer.encode(p)) for p in PROMPTS)
    assert r.usage.completion_tokens == sum(len(e.token_ids) for e in expected)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_matches_the_offline_engine(client, llm, tokenizer):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Name a colour."}]},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another?"},
    ]
    r = client.chat.completions.create(
        model=MODEL, messages=messages, max_completion_tokens=16, temperature=0
    )
    flat = [{**m, "content": m["content"] if isinstance(m["content"], str) else "Name a colour."}
            for m in messages]  # fmt: skip
    params = SamplingParams(max_tokens=16, temperature=0, logprobs=2)
    expected = llm.chat(flat, params, use_tqdm=False)
    assert_well_separated(expected[0].outputs[0], "chat")
    assert r.choices[0].message.content == expected[0].outputs[0].text
    assert r.choices[0].message.role == "assistant" and r.object == "chat.completion"
    assert r.usage.prompt_tokens == len(encode_chat(tokenizer, flat))


def test_streamed_and_non_streamed_greedy_outputs_are_identical(client, llm):
    # The second request finds the first one's prompt blocks cached (a shorter prefill):
    # the tokens must be well clear of near-ties for the two to be compared exactly.
    offline(llm, PROMPTS[1], max_tokens=24, temperature=0)
    messages = [{"role": "user", "content": "Tell me a story."}]
    params = SamplingParams(max_tokens=24, temperature=0, logprobs=2)
    story = llm.chat(messages, params, use_tqdm=False)
    assert_well_separated(story[0].outputs[0], "chat")
    args = dict(model=MODEL, prompt=PROMPTS[1], max_tokens=24, temperature=0)
    whole = client.completions.create(**args)
    chunks = list(
        client.completions.create(**args, stream=True, stream_options={"include_usage": True})
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    # the same counts, but the second found the first one's prompt blocks cached
    streamed_usage, whole_usage = chunks[-1].usage.model_dump(), whole.usage.model_dump()
    streamed_cached = streamed_usage.pop("prompt_tokens_details")["cached_tokens"]
    assert streamed_cached >= whole_usage.pop("prompt_tokens_details")["cached_tokens"]
    assert chunks[-1].choices == [] and streamed_usage == whole_usage
    assert [c.choices[0].finish_reason for c in chunks[:-1]][-1] == whole.choices[0].finish_reason
    assert all(c.usage is None for c in chunks[:-1])

    whole = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=24, temperature=0
    )
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=24, temperature=0, stream=True
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_n2_with_a_seed_is_reproducible_and_matches_the_engine(client, llm):
    args = dict(model=MODEL, prompt=PROMPTS[0], max_tokens=16, n=2, temperature=0.9, top_p=0.95)
    first = client.completions.create(**args, seed=11)
    again = client.completions.create(**args, seed=11)
    other = client.completions.create(**args, seed=12)
    texts = [c.text for c in sorted(first.choices, key=lambda c: c.index)]
    assert texts == [c.text for c in sorted(again.choices, key=lambda c: c.index)]
    assert texts != [c.text for c in sorted(other.choices, key=lambda c: c.index)]
    expected = offline(llm, PROMPTS[0], n=2, seed=11, temperature=0.9, top_p=0.95, max_tokens=16)
    assert texts == [e.text for e in expected]


def test_every_sampling_parameter_reaches_the_engine(client, llm):
    extra = dict(top_k=20, min_p=0.05, repetition_penalty=1.3, min_tokens=5, stop_token_ids=[7])
    common = dict(max_tokens=12, temperature=0.8, top_p=0.9, seed=5)
    penalties = dict(presence_penalty=0.5, frequency_penalty=0.3)
    r = client.completions.create(
        model=MODEL, prompt=PROMPTS[0], logit_bias={"9": 3.0}, user="u1", extra_body=extra,
        **common, **penalties,
    )  # fmt: skip
    expected = offline(llm, PROMPTS[0], logit_bias={9: 3.0}, **extra, **common, **penalties)
    assert r.choices[0].text == expected[0].text
    plain = client.completions.create(model=MODEL, prompt=PROMPTS[0], **common)
    assert plain.choices[0].text != r.choices[0].text  # the parameters changed something


def test_stop_strings_end_the_text_before_the_stop(client, llm):
    offline(llm, PROMPTS[1], max_tokens=40, temperature=0, ignore_eos=True)  # no near-tie
    args = dict(model=MODEL, prompt=PROMPTS[1], max_tokens=40, temperature=0)
    args["extra_body"] = {"ignore_eos": True}  # long enough to cut, whatever the model
    full = client.completions.create(**args).choices[0].text
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    cut = client.completions.create(**args, stop=[stop, "\x00never"]).choices[0]
    assert cut.finish_reason == "stop" and cut.text == full[: full.index(stop)]
    chunks = list(client.completions.create(**args, stop=stop, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == cut.text


def test_completion_logprobs_match_the_engine(client, llm):
    args = dict(max_tokens=8, temperature=0, logprobs=3)
    r = client.completions.create(
        model=MODEL, prompt=PROMPTS[0], **args, extra_body={"ignore_eos": True}
    )
    lp = r.choices[0].logprobs
    expected = offline(llm, PROMPTS[0], ignore_eos=True, **args)[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == r.usage.completion_tokens == 8
    for got, want, top in zip(lp.token_logprobs, expected, lp.top_logprobs):
        # computed on the nodes and offline: a logit and the normaliser may each be off by
        # float32 rounding; the top entry is the same number as `got`
        assert math.isclose(got, want.logprob, abs_tol=2 * LOGIT_ROUNDING)
        assert 1 <= len(top) <= 3 and math.isclose(max(top.values()), got, abs_tol=1e-4)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(8)]


def test_chat_logprobs_have_openais_shape(client):
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for item in content:
        assert len(item.top_logprobs) == 2 and item.bytes == list(item.token.encode())
        assert math.isclose(item.logprob, item.top_logprobs[0].logprob, abs_tol=1e-4)


def test_the_largest_seed_with_n2_wraps_instead_of_failing(client):
    r = client.completions.create(model=MODEL, prompt="x", max_tokens=2, n=2, seed=2**63 - 1)
    assert len(r.choices) == 2


def test_token_id_prompts_and_echo(client, tokenizer):
    ids = tokenizer.encode(PROMPTS[0])
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0)
    by_text = client.completions.create(
        model=MODEL, prompt=PROMPTS[0], max_tokens=8, temperature=0, echo=True
    )
    assert by_text.choices[0].text == PROMPTS[0] + by_ids.choices[0].text


def test_models_tokenize_and_detokenize(serve, tokenizer):
    models = httpx.get(f"{serve.url}/v1/models", timeout=HANG_S).json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert models["data"][0]["max_model_len"] == 512  # SERVE_FLAGS' --max-model-len, vLLM's field
    tok = httpx.post(f"{serve.url}/tokenize", json={"prompt": PROMPTS[1]}, timeout=HANG_S).json()
    assert tok["tokens"] == tokenizer.encode(PROMPTS[1]) and tok["count"] == len(tok["tokens"])
    text = httpx.post(
        f"{serve.url}/detokenize", json={"tokens": tok["tokens"]}, timeout=HANG_S
    ).json()
    assert text["prompt"] == PROMPTS[1]
    messages = [{"role": "user", "content": "Hi"}]
    chat = httpx.post(f"{serve.url}/tokenize", json={"messages": messages}, timeout=HANG_S).json()
    assert chat["tokens"] == encode_chat(tokenizer, messages)
    for bad in ({"messages": []}, {}, {"prompt": "x", "messages": messages}, {"tokens": [-1]}):
        path = "/detokenize" if "tokens" in bad else "/tokenize"
        assert httpx.post(f"{serve.url}{path}", json=bad, timeout=HANG_S).status_code == 400


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "x", "temperature": 3}, "temperature"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "x", "max_tokens": 600}, "max_tokens"),
        ({"prompt": "word " * 600}, "prompt"),
        ({"prompt": [10**6]}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": "x", "logit_bias": {"abc": 1}}, "logit_bias"),
        ({"prompt": "x", "n": 0}, "n"),
        ({"prompt": "x", "stop": [""]}, "stop"),
        ({"prompt": "x", "logprobs": 21}, "logprobs"),
        ({"prompt": "x", "min_tokens": 9, "max_tokens": 2}, "min_tokens"),
        ({"prompt": "x", "suffix": "y"}, "suffix"),
        ({"prompt": "x", "seed": 2**64}, "seed"),
        ({"prompt": "x", "top_k": 10**20}, "top_k"),
        ({"prompt": "x", "min_tokens": 10**20, "max_tokens": None}, "min_tokens"),
        ({"prompt": [[1, 2], []]}, "prompt"),
        ({"nothing": 1}, "prompt"),
    ],
)
def test_invalid_completion_parameters_are_400(serve, body, param):
    r = httpx.post(f"{serve.url}/v1/completions", json=body, timeout=HANG_S)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    if param is not None:
        assert error["param"] == param


@pytest.mark.parametrize(
    "body",
    [
        {"messages": []},
        {"messages": [{"role": "tool", "content": "x"}]},
        {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
        {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        {"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": "x"},
        {
            "messages": [{"role": "user", "content": "x"}],
            "chat_template_kwargs": {"add_generation_prompt": False},
        },
    ],
)
def test_invalid_chat_requests_are_400(serve, body):
    r = httpx.post(f"{serve.url}/v1/chat/completions", json=body, timeout=HANG_S)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_malformed_json_is_400_and_unknown_model_404(client, serve):
    r = httpx.post(
        f"{serve.url}/v1/completions",
        content=b"{",
        headers={"content-type": "application/json"},
        timeout=HANG_S,
    )
    assert r.status_code == 400
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model="gpt-5", prompt="x", max_tokens=2)
    assert "gpt-5" in err.value.body["message"]
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="word " * 600, max_tokens=2)


def test_unknown_routes_and_wrong_methods_answer_in_the_apis_error_shape(serve):
    """Not FastAPI's `{"detail": ...}`: an OpenAI client reads the message either way."""
    missing = httpx.get(f"{serve.url}/v1/nope", timeout=HANG_S)
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "not_found_error"
    wrong = httpx.post(f"{serve.url}/v1/models", json={}, timeout=HANG_S)
    assert wrong.status_code == 405 and "GET" in wrong.headers["allow"]
    assert wrong.json()["error"]["code"] == 405


def test_router_hashes_match_the_nodes_and_the_index_finds_prefixes(client, serve, tokenizer):
    prompt = "A shared system prompt that is long enough to fill several KV blocks. " * 4
    ids = tokenizer.encode(prompt)
    expected = hash_blocks(ids, 16)
    assert len(expected) >= 3
    client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
    (prefill,) = serve.workers("prefill")
    snapshot = httpx.get(f"{prefill['url']}/kv/snapshot", timeout=HANG_S, headers=NODE_HEADERS)
    cached = set(snapshot.json()["hashes"])
    assert set(expected) <= cached  # the same stable hashes on both sides

    def overlap() -> float:
        text = httpx.get(f"{serve.url}/metrics", timeout=HANG_S).text
        return metric_value(text, "tandem_router_prefix_overlap_blocks_total")

    before = overlap()
    # the index learns of the blocks from KV events; a repeat then routes with the overlap
    assert wait_until(
        lambda: (
            client.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
            and overlap() - before >= len(expected)
        ),
        interval=0.2,
    )


def test_metrics_count_requests_and_selections(serve, client):
    client.completions.create(model=MODEL, prompt="x", max_tokens=2)
    text = httpx.get(f"{serve.url}/metrics", timeout=HANG_S).text
    labels = {"handler": "/v1/completions", "status": "200"}
    assert metric_value(text, "tandem_router_requests_total", **labels) >= 1
    assert metric_value(text, "tandem_router_worker_selections_total", worker_role="decode") >= 1
    assert metric_value(text, "tandem_router_worker_healthy", worker_role="prefill") == 1
    assert metric_value(text, "tandem_time_to_first_token_seconds_count", role="router") >= 1
