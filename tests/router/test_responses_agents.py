"""The OpenAI Agents SDK (`agents`) against a real `tandem serve` through the Responses
API: an agent with one function tool, run by `Runner` on `OpenAIResponsesModel`. The
model is random, so `tool_choice` forces the call (and thinking is off, so the call
comes at once); what is checked is that the tool runs with arguments that validate and
that the run ends. Every argument is bounded (an enum, a ranged integer), as in
`test_client_libraries`: a random model sampling a free string or integer under the call's
grammar may write on until `max_tokens` (an incomplete response, which the SDK raises on)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI
from openai.types.shared import Reasoning
from pydantic import BaseModel, Field

from tests.bounds import HANG_S

MODEL = "qwen3"


class Forecast(BaseModel):
    sky: Literal["sunny", "rainy"]


@pytest.fixture
def agent_parts(qwen3_serve):
    """An agent whose one tool records its calls, and the calls it records."""
    set_tracing_disabled(True)  # no trace export (no network)
    calls: list[tuple[str, int]] = []

    @function_tool
    def get_weather(city: Literal["Paris", "Rome"], days: Annotated[int, Field(ge=1, le=9)]) -> str:
        """The weather in a city for some days."""
        calls.append((city, days))
        return f"sunny in {city}"

    client = AsyncOpenAI(base_url=f"{qwen3_serve.url}/v1", api_key="unused", max_retries=0)
    model = OpenAIResponsesModel(model=MODEL, openai_client=client)

    def agent(**extra) -> Agent:
        settings = ModelSettings(
            tool_choice="get_weather", reasoning=Reasoning(effort="none"), max_tokens=80
        )
        return Agent(name="weather", instructions="Use the tool.", model=model,
                     model_settings=settings, tools=[get_weather], **extra)  # fmt: skip

    return agent, calls


def test_an_agent_calls_its_forced_tool_and_stops(agent_parts):
    make, calls = agent_parts
    agent = make(tool_use_behavior="stop_on_first_tool")
    result = asyncio.run(asyncio.wait_for(Runner.run(agent, "Weather in Paris?"), HANG_S))
    ((city, days),) = calls
    assert city in ("Paris", "Rome") and isinstance(days, int) and 1 <= days <= 9
    assert result.final_output == f"sunny in {city}"
    (response,) = result.raw_responses
    assert response.usage.input_tokens > 0 and response.usage.output_tokens > 0


def test_a_streamed_agent_answers_in_its_output_type_after_its_tool(agent_parts):
    """`reset_tool_choice` (the default) lets the model answer after the tool's result
    (the second request sends the call and its output back as input items), in the
    agent's `output_type`: a JSON schema format, which a random model's answer follows
    to its end (plain text would run to `max_tokens`, an incomplete response)."""
    make, calls = agent_parts
    agent = make(output_type=Forecast)

    async def run():
        result = Runner.run_streamed(agent, "Weather in Paris?", max_turns=2)
        kinds = [event.type async for event in result.stream_events()]
        return result, kinds

    result, kinds = asyncio.run(asyncio.wait_for(run(), HANG_S))
    ((city, days),) = calls
    assert city in ("Paris", "Rome") and 1 <= days <= 9 and "raw_response_event" in kinds
    first, second = result.raw_responses
    assert [item.type for item in first.output] == ["function_call"]
    assert [item.type for item in second.output] == ["message"]
    assert isinstance(result.final_output, Forecast)
