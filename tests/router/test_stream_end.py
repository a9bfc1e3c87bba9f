"""A streamed answer always ends with `data: [DONE]`: malformed tool calls in the model's
text (no error at all), and even a fault of the router's own formatting (an error event,
then the end). No processes: a scripted dispatcher stands in for the decode workers."""

from __future__ import annotations

import asyncio
import json

from prometheus_client import CollectorRegistry

from tandem.router.cpu_pool import CpuPool
from tandem.router.dispatch import Job
from tandem.router.generation import Generation, GenerationRunner
from tandem.router.metrics import RouterMetrics
from tandem.router.responses import ChatFormat
from tandem.router.tool_parsers import HermesParser
from tests.router.test_failure_metrics import Connected, ScriptedDispatcher


def text_record(text: str, finish: str | None = None) -> dict:
    rec = {"token_ids": [1], "text": text, "logprobs": None, "finish_reason": finish}
    if finish:
        rec |= {"stop_reason": None, "usage": {"completion_tokens": 1}}
    return rec


def stream_chunks(fmt, texts: list[str]) -> list[str]:
    records = [text_record(t) for t in texts[:-1]] + [text_record(texts[-1], "stop")]
    runner = GenerationRunner(
        ScriptedDispatcher([records]), RouterMetrics(CollectorRegistry(), "m", "r"), 4, CpuPool(1)
    )

    def build() -> Generation:
        return Generation("r", "m", fmt, [Job("r-0", None, {})], [""], 1, False)

    async def go() -> list[str]:
        response = await runner.respond(build, True, Connected())
        return [chunk async for chunk in response.body_iterator]

    return asyncio.run(go())


def test_a_malformed_tool_call_name_still_ends_the_stream(tokenizer):
    texts = ["Hi.<tool_call>\n", '{"name": "a\\qb", ', '"arguments": {}}\n</tool_call>']
    chunks = stream_chunks(ChatFormat(None, False, HermesParser(tokenizer)), texts)
    assert chunks[-1] == "data: [DONE]\n\n"
    events = [json.loads(c[6:]) for c in chunks[:-1]]
    assert not any("error" in e for e in events)
    content = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
    assert content == "Hi." and not any("tool_calls" in e["choices"][0]["delta"] for e in events)


class BrokenFormat(ChatFormat):
    def deltas(self, state, record, first):
        if record["finish_reason"] is not None:
            raise RuntimeError("a bug in formatting")
        return super().deltas(state, record, first)


def test_a_fault_while_formatting_ends_with_an_error_event_and_done():
    chunks = stream_chunks(BrokenFormat(None, False), ["Hello", " there"])
    assert chunks[-1] == "data: [DONE]\n\n"
    last = json.loads(chunks[-2][6:])
    assert last["error"]["type"] == "server_error"
