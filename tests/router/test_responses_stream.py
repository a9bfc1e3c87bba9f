"""`ResponsesWriter` on its own, over Qwen3's real tokenizer with its reasoning and tool-call
parsers: a reply that reasons, answers and calls (what a random model never writes) is
streamed piece by piece, and every event must validate against the openai SDK's own event
types; the streamed response must say what the same reply written whole says."""

from __future__ import annotations

import asyncio
import json

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from prometheus_client import CollectorRegistry, generate_latest
from pydantic import TypeAdapter
from transformers import AutoTokenizer

from tandem.router.cpu_pool import CpuPool
from tandem.router.dispatch import Job, StreamBroken
from tandem.router.errors import UpstreamFailed
from tandem.router.generation import Generation, GenerationRunner
from tandem.router.metrics import RouterMetrics
from tandem.router.preprocess import ModelLimits, Preprocessor, Prompt
from tandem.router.reasoning import Qwen3Parser
from tandem.router.responses import ChatFormat
from tandem.router.responses_output import ReasoningCounter
from tandem.router.responses_stream import ResponsesWriter
from tests.assets import npm_tokenizer
from tests.disagg.nodes import metric_value
from tests.router.test_failure_metrics import FAILURES, Connected, ScriptedDispatcher

EVENT = TypeAdapter(ResponseStreamEvent)
SKELETON = {
    "id": "resp_1", "object": "response", "created_at": 1, "status": "in_progress",
    "error": None, "incomplete_details": None, "instructions": None, "metadata": {},
    "model": "qwen3", "output": [], "parallel_tool_calls": True, "temperature": None,
    "tool_choice": "auto", "tools": [], "top_p": None, "usage": None,
}  # fmt: skip
CALL = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
)
# the reply in pieces as records bring them: reasoning, an answer, a call in fragments
PIECES = ["<think>", "Let me", " see.", "</think>", "\n\nThe answer", " is 42.\n",
          CALL[:14], CALL[14:40], CALL[40:70], CALL[70:]]  # fmt: skip


@pytest.fixture(scope="module")
def pre():
    tokenizer = AutoTokenizer.from_pretrained(npm_tokenizer("qwen3"))
    limits = ModelLimits("qwen3", len(tokenizer), 4096, 16, (tokenizer.eos_token_id,))
    return Preprocessor(tokenizer, limits)


def writer(pre, kind: type[ResponsesWriter] = ResponsesWriter) -> ResponsesWriter:
    fmt = ChatFormat(pre, False, pre.structured.tool_parser, Qwen3Parser())
    job = Job("resp_1-0", Prompt([1] * 7, None, ()), {})
    gen = Generation("resp_1", "qwen3", fmt, [job], [""], 7, False)
    end_id = pre.tokenizer.get_added_vocab()["</think>"]
    counter = ReasoningCounter(end_id, lambda text: pre.tokenize(text, False))
    return kind(gen, SKELETON, [], None, counter)


def records(pre, pieces: list[str] = PIECES) -> list[dict]:
    out = []
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        out.append({
            "text": piece, "token_ids": pre.tokenize(piece, False), "logprobs": None,
            "finish_reason": "stop" if last else None, "stop_reason": None,
            "usage": {"completion_tokens": 0} if last else None,
        })  # fmt: skip
    total = sum(len(r["token_ids"]) for r in out)
    out[-1]["usage"]["completion_tokens"] = total
    return out


def stream(out: ResponsesWriter, pre, end=None, pieces: list[str] = PIECES) -> list[dict]:
    texts = out.start()
    for record in records(pre, pieces):
        out.gen.states[0].add(record)
        texts += out.record(0, record)
    texts += out.done() if end is None else out.failed(end)
    events = []
    for text in texts:
        head, data = text.strip().split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert head == f"event: {event['type']}"
        EVENT.validate_python(event)  # the SDK's own types, strictly
        events.append(event)
    return events


def test_a_reply_that_reasons_answers_and_calls_streams_as_the_sdk_types_it(pre):
    events = stream(writer(pre), pre)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = Response.model_validate(events[-1]["response"])
    assert events[-1]["type"] == "response.completed" and final.status == "completed"
    assert [item.type for item in final.output] == ["reasoning", "message", "function_call"]
    reasoning, message, call = final.output
    assert reasoning.content[0].text == "Let me see."
    assert message.content[0].text == "\n\nThe answer is 42."  # blanks before a call go
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris", "days": 2})
    added = [e["item"]["id"] for e in events if e["type"] == "response.output_item.added"]
    assert added == [item.id for item in final.output]
    deltas = "".join(e["delta"] for e in events if e["type"].endswith("arguments.delta"))
    assert deltas == call.arguments
    usage = final.usage
    thinking = len(pre.tokenize("<think>Let me see.</think>", False))
    assert usage.output_tokens_details.reasoning_tokens == thinking
    assert usage.total_tokens == 7 + usage.output_tokens


def test_calls_one_after_another_are_items_one_after_another(pre):
    second = CALL.replace("Paris", "Rome").replace("2}", "3}")
    events = stream(writer(pre), pre, pieces=[CALL[:30], CALL[30:] + "\n" + second[:20],
                                              second[20:]])  # fmt: skip
    final = events[-1]["response"]
    assert [(i["type"], json.loads(i["arguments"])["city"]) for i in final["output"]] == [
        ("function_call", "Paris"), ("function_call", "Rome"),
    ]  # fmt: skip
    added = [(e["output_index"], e["item"]["id"]) for e in events
             if e["type"] == "response.output_item.added"]  # fmt: skip
    assert added == [(i, item["id"]) for i, item in enumerate(final["output"])]
    deltas = [e for e in events if e["type"].endswith("arguments.delta")]
    for index, item in enumerate(final["output"]):
        fragments = [e["delta"] for e in deltas if e["output_index"] == index]
        assert "".join(fragments) == item["arguments"]
    assert len({item["call_id"] for item in final["output"]}) == 2


def test_the_stream_ends_as_the_whole_reply_reads(pre):
    streamed = stream(writer(pre), pre)[-1]["response"]
    whole_writer = writer(pre)
    for record in records(pre):
        whole_writer.gen.states[0].add(record)
    whole = whole_writer.whole()

    def shape(body):
        return [{k: v for k, v in item.items() if k not in ("id", "call_id")}
                for item in body["output"]]  # fmt: skip

    assert shape(streamed) == shape(whole) and streamed["usage"] == whole["usage"]


def test_a_failure_mid_stream_ends_in_response_failed(pre):
    events = stream(writer(pre), pre, UpstreamFailed("decode worker failed mid-stream"))
    assert events[-1]["type"] == "response.failed"
    final = Response.model_validate(events[-1]["response"])
    assert final.status == "failed" and final.error.code == "server_error"
    assert [item.status for item in final.output][-1] == "incomplete"


def through_runner(
    pre, script: list, kind: type[ResponsesWriter] = ResponsesWriter
) -> tuple[RouterMetrics, list[dict]]:
    """The generation run by the router's own runner (a scripted dispatcher for the
    decode workers), streamed by a writer of `kind`; (metrics, events)."""
    metrics = RouterMetrics(CollectorRegistry(), "qwen3", "router-0")
    runner = GenerationRunner(ScriptedDispatcher([script]), metrics, 4, CpuPool(1))
    out = writer(pre, kind)

    async def go() -> list[str]:
        response = await runner.respond(lambda: out.gen, True, Connected(), 1, lambda _: out)
        return [text async for text in response.body_iterator]

    texts = asyncio.run(go())
    events = [json.loads(text.strip().split("\n")[1].removeprefix("data: ")) for text in texts]
    for event in events:
        EVENT.validate_python(event)
    return metrics, events


def test_a_decode_worker_lost_mid_stream_fails_the_response_and_is_counted(pre):
    script = [*records(pre)[:5], StreamBroken("decode worker failed mid-stream")]
    metrics, events = through_runner(pre, script)
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"]["message"] == "decode worker failed mid-stream"
    text = generate_latest(metrics.registry).decode()
    failed = metric_value(text, FAILURES, reason="stream_broken", via="event")
    assert failed == 1


class BrokenWriter(ResponsesWriter):
    def record(self, index, record):
        if record["finish_reason"] is not None:
            raise RuntimeError("a bug in writing")
        return super().record(index, record)


def test_a_fault_of_the_writers_own_still_ends_the_stream(pre):
    _, events = through_runner(pre, records(pre), BrokenWriter)
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"]["code"] == "server_error"
