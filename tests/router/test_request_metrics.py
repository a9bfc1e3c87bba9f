"""The router's per-request metrics (phases, lengths, finish reasons), the cached prompt
tokens in `usage`, the nodes' tokens per step, and process metrics on every process: first
the phase arithmetic alone, then a real `tandem serve` (every request disaggregated)."""

from __future__ import annotations

import httpx
import openai
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tandem.router.phase_metrics import TTFT_PHASES, ChoiceClock, PhaseMetrics
from tests.bounds import HANG_S
from tests.disagg.nodes import metric_value

PHASE = "tandem_request_phase_seconds"
LABELS = {"model": "m", "role": "router", "pod": "p"}


def token(at: float, finish: str | None = None, **extra) -> dict:
    record = {"token_ids": [1], "finish_reason": finish, "received_at": at, **extra}
    if finish:
        record["usage"] = {"prompt_tokens": 40, "completion_tokens": 3}
    return record


def test_ttft_phases_add_up_to_the_time_to_first_token():
    clock = ChoiceClock(start=100.0)
    timings = {"queue_s": 0.5, "remote_s": 2.0, "prefill_s": 1.5, "transfer_s": 1.0}
    clock.on_record(token(103.0, timings=timings))
    clock.on_record(token(103.25))
    clock.on_record(token(104.0, "length"))
    phases = clock.phases()
    assert phases == {
        "queue": 0.5, "remote_prefill": 1.5, "kv_transfer": 0.5, "other": 0.5,
        "first_decode": 0.25, "decode": 1.0,
    }  # fmt: skip
    assert sum(phases[p] for p in TTFT_PHASES) == clock.first - clock.start
    metrics = PhaseMetrics(CollectorRegistry(), LABELS)
    metrics.observe(clock)
    text = generate_latest(metrics.registry).decode()
    tpot = "tandem_request_time_per_output_token_seconds"
    assert metric_value(text, f"{tpot}_count") == 1
    assert metric_value(text, f"{tpot}_sum") == (104.0 - 103.0) / (3 - 1)


def test_a_local_prefill_has_no_ttft_phases_and_an_abandoned_choice_counts_as_abort():
    metrics = PhaseMetrics(CollectorRegistry(), LABELS)
    clock = ChoiceClock(start=0.0)
    clock.on_record(token(1.0))
    metrics.observe(clock)  # the client left before the end
    text = generate_latest(metrics.registry).decode()
    assert metric_value(text, f"{PHASE}_count", phase="first_decode") == 0
    assert metric_value(text, f"{PHASE}_count", phase="queue") == 0
    assert metric_value(text, "tandem_request_success_total", finish_reason="abort") == 1
    assert metric_value(text, "tandem_request_prompt_tokens_count") == 0


@pytest.fixture(scope="module")
def client(serve):
    return openai.OpenAI(base_url=f"{serve.url}/v1", api_key="unused", max_retries=0)


def scrape(url: str) -> str:
    return httpx.get(f"{url}/metrics", timeout=HANG_S).text


def test_a_disaggregated_request_is_broken_into_phases(serve, client, tokenizer):
    before = scrape(serve.url)
    prompt = "Tell me about the history of the printing press in Europe. " * 4
    args = dict(model="llama", prompt=prompt, max_tokens=5, extra_body={"ignore_eos": True})
    first = client.completions.create(**args)
    second = client.completions.create(**args, stream=True, stream_options={"include_usage": True})
    usage = list(second)[-1].usage
    num_prompt = len(tokenizer.encode(prompt))
    assert first.usage.prompt_tokens == usage.prompt_tokens == num_prompt
    # the decode node kept the first one's full prompt blocks in its prefix cache
    assert usage.prompt_tokens_details.cached_tokens == (num_prompt - 1) // 16 * 16 > 0

    after = scrape(serve.url)

    def grew(name: str, **labels: str) -> float:
        return metric_value(after, name, **labels) - metric_value(before, name, **labels)

    for phase in (*TTFT_PHASES, "first_decode", "decode"):
        assert grew(f"{PHASE}_count", phase=phase) == 2, phase
    assert grew("tandem_request_success_total", finish_reason="length") == 2
    assert grew("tandem_request_prompt_tokens_sum") == 2 * num_prompt
    assert grew("tandem_request_generation_tokens_sum") == 10
    assert grew("tandem_request_time_per_output_token_seconds_count") == 2
    ttft_phases = sum(grew(f"{PHASE}_sum", phase=p) for p in TTFT_PHASES)
    assert 0 < ttft_phases <= grew("tandem_e2e_request_latency_seconds_sum")
    for worker in serve.workers():
        text = httpx.get(worker["metrics_url"], timeout=HANG_S).text  # the metrics port
        assert metric_value(text, "process_resident_memory_bytes") > 0, worker
        assert metric_value(text, "process_open_fds") > 0, worker
        # a prefill node's steps are prompt chunks, a decode node's include decode steps
        assert metric_value(text, "tandem_iteration_tokens_total_count") > 0, worker
    assert metric_value(after, "process_cpu_seconds_total") > 0


def test_a_non_streamed_request_times_its_first_token_when_it_came_off_the_wire(serve, client):
    """The router holds a non-streamed choice's records until the last one; its time to first
    token is still when the first token arrived, not when the reply was complete."""
    before = scrape(serve.url)
    client.completions.create(
        model="llama", prompt="Once upon a time", max_tokens=24, extra_body={"ignore_eos": True}
    )
    after = scrape(serve.url)

    def grew(name: str, **labels: str) -> float:
        return metric_value(after, name, **labels) - metric_value(before, name, **labels)

    assert grew("tandem_time_to_first_token_seconds_count") == 1
    decode = grew(f"{PHASE}_sum", phase="decode")  # first -> last token, off the wire
    assert decode > 0
    e2e = grew("tandem_e2e_request_latency_seconds_sum")
    assert grew("tandem_time_to_first_token_seconds_sum") <= e2e - decode
