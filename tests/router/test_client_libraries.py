"""The client libraries people build with, against a real `tandem serve` (a tiny random
Qwen3 with Qwen3's own template, thinking off): `langchain-openai` (`bind_tools`, a tool
result sent back, `with_structured_output` by JSON schema and by function calling) and
`instructor` (a pydantic model out, by tools; from the Makefile's `.venv-clients`, as its
pins clash with the project's). The model is random, so every answer is
forced (a named tool, a schema); what is checked is the protocol: the libraries parse
what the server sends into valid calls and models, and a tool's result reaches the prompt.
Every field is bounded (enums, ranged integers, no extra keys) so that a random answer
fits its budget."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Annotated, Literal

import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, ConfigDict, Field

from tests.bounds import HANG_S

MODEL = "qwen3"
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


class Forecast(BaseModel):
    model_config = ConfigDict(extra="forbid")  # additionalProperties: false
    sky: Literal["sunny", "rainy"]
    days: int = Field(ge=1, le=9)


@tool
def get_weather(city: Literal["Paris", "Rome"], days: Annotated[int, Field(ge=1, le=9)]) -> str:
    """The weather in a city for some days."""
    return f"sunny in {city} for {days} days"


@pytest.fixture
def chat(qwen3_serve) -> ChatOpenAI:
    return ChatOpenAI(
        model=MODEL, base_url=f"{qwen3_serve.url}/v1", api_key="unused", max_retries=0,
        timeout=HANG_S, max_tokens=60, temperature=1.0, extra_body=NO_THINKING,
    )  # fmt: skip


def test_langchain_binds_a_tool_and_sends_its_result_back(chat):
    forced = chat.bind_tools([get_weather], tool_choice="get_weather", strict=True)
    question = HumanMessage("Weather in Paris for two days?")
    reply = forced.invoke([question])
    (call,) = reply.tool_calls
    assert call["name"] == "get_weather" and call["id"]
    assert call["args"]["city"] in ("Paris", "Rome") and 1 <= call["args"]["days"] <= 9
    result = ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])
    answer = chat.bind_tools([get_weather]).invoke([question, reply, result])
    assert isinstance(answer.content, str)
    # the call and its result are in the second prompt: it is longer by at least the result
    first, second = reply.usage_metadata, answer.usage_metadata
    assert second["input_tokens"] > first["input_tokens"] + len(result.content.split())
    assert first["total_tokens"] == first["input_tokens"] + first["output_tokens"]


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_structured_output_is_a_valid_model(chat, method):
    structured = chat.with_structured_output(Forecast, method=method, strict=True)
    forecast = structured.invoke("Forecast for Rome?")
    assert isinstance(forecast, Forecast) and 1 <= forecast.days <= 9


def clients_python() -> Path:
    """The python of the Makefile's `.venv-clients` ($TANDEM_CLIENTS_PYTHON overrides)."""
    default = Path(__file__).resolve().parents[2] / ".venv-clients" / "bin" / "python"
    return Path(os.environ.get("TANDEM_CLIENTS_PYTHON", default))


def test_instructor_returns_a_valid_pydantic_model(qwen3_serve):
    python = clients_python()
    if not python.is_file():
        pytest.skip(f"no {python}: `make clients` (a part of `make test`) builds it")
    script = Path(__file__).with_name("instructor_client.py")
    run = subprocess.run(
        [str(python), "-P", str(script), f"{qwen3_serve.url}/v1", str(HANG_S)],
        capture_output=True, text=True, timeout=HANG_S,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout)
    forecast = Forecast.model_validate(got["forecast"])  # instructor's, checked again here
    assert 1 <= forecast.days <= 9 and got["calls"] == ["Forecast"]
    usage = got["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0
