"""Run by tests/router/test_client_libraries.py with the python of the Makefile's
`.venv-clients` (instructor's pins clash with the project's): asks a Tandem router for a
pydantic model through `instructor` (tool mode) and prints what it got as JSON.

    python instructor_client.py BASE_URL TIMEOUT_S
"""

import json
import sys
from typing import Literal

import instructor
from openai import OpenAI
from pydantic import BaseModel, ConfigDict, Field


class Forecast(BaseModel):
    model_config = ConfigDict(extra="forbid")  # additionalProperties: false
    sky: Literal["sunny", "rainy"]
    days: int = Field(ge=1, le=9)


def main() -> None:
    base_url, timeout = sys.argv[1], float(sys.argv[2])
    openai = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=timeout)
    client = instructor.from_openai(openai, mode=instructor.Mode.TOOLS)
    forecast, completion = client.chat.completions.create_with_completion(
        model="qwen3", response_model=Forecast, max_retries=0, max_tokens=60,
        messages=[{"role": "user", "content": "Forecast for Paris?"}],
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )  # fmt: skip
    calls = completion.choices[0].message.tool_calls or []
    counts = {"prompt_tokens", "completion_tokens", "total_tokens"}
    print(json.dumps({
        "forecast": forecast.model_dump(),
        "calls": [call.function.name for call in calls],
        "usage": completion.usage.model_dump(include=counts),
        "instructor": instructor.__version__,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
