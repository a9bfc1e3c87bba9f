"""The Responses API's store (retrieve, delete, `store: false`, the bound, through a real
router and on its own) and its refusals: every bad request is a 4xx in OpenAI's error
shape, and the server goes on serving."""

from __future__ import annotations

import httpx
import openai
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from tandem.router import cli
from tandem.router.response_store import DEFAULT_SIZE, ResponseStore, StoredResponse
from tests.bounds import HANG_S
from tests.disagg.nodes import metric_value, wait_until
from tests.router.conftest import RouterProc

MODEL = "qwen3"
NO_THINKING = {"effort": "none"}
FUZZ_EXAMPLES = 15  # per operation


@pytest.fixture(scope="module")
def client(qwen3_serve):
    return openai.OpenAI(base_url=f"{qwen3_serve.url}/v1", api_key="unused", max_retries=0)


def create(client, **extra):
    return client.responses.create(
        model=MODEL, input="Hi", max_output_tokens=2, reasoning=NO_THINKING, **extra
    )


def num_requests(serve, status: str) -> float:
    text = httpx.get(f"{serve.url}/metrics", timeout=HANG_S).text
    return metric_value(
        text, "tandem_router_requests_total", handler="/v1/responses/{id}", status=status
    )


def test_retrieve_then_delete_then_404(client, qwen3_serve):
    made = create(client)
    assert client.responses.retrieve(made.id).model_dump() == made.model_dump()
    url = f"{qwen3_serve.url}/v1/responses/{made.id}"
    deleted = httpx.delete(url, timeout=HANG_S)
    assert deleted.json() == {"id": made.id, "object": "response", "deleted": True}
    before = num_requests(qwen3_serve, "404")
    for method in ("GET", "DELETE"):
        reply = httpx.request(method, url, timeout=HANG_S)
        assert reply.status_code == 404
        assert reply.json()["error"]["type"] == "invalid_request_error"
    assert wait_until(lambda: num_requests(qwen3_serve, "404") == before + 2)  # ids left out
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        create(client, previous_response_id=made.id)


def test_a_response_not_stored_cannot_be_retrieved_or_continued(client):
    made = create(client, store=False)
    assert made.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(made.id)


BAD = {
    "a wrong type": ({"input": 5}, 400, "input"),
    "an unknown model": ({"model": "gpt-9"}, 404, "model"),
    "a hosted tool": ({"tools": [{"type": "web_search"}]}, 400, "tools.0"),
    "a file_search tool": ({"tools": [{"type": "file_search"}]}, 400, "tools.0"),
    "an output for no call": (
        {"input": [{"type": "function_call_output", "call_id": "call_x", "output": "1"}]},
        400, "input.0.call_id",
    ),
    "an image": (
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        400, "input.0",
    ),
    "an unknown item": ({"input": [{"type": "item_reference", "id": "x"}]}, 400, "input.0"),
    "call arguments not JSON": (
        {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}]},
        400, "input.0.arguments",
    ),
    "an unknown previous response": ({"previous_response_id": "resp_x"}, 404,
                                     "previous_response_id"),
    "a tool_choice of a hosted tool": ({"tool_choice": {"type": "web_search"}}, 400,
                                       "tool_choice"),
    "a tool_choice naming no tool": (
        {"tool_choice": {"type": "function", "name": "f"}}, 400, "tool_choice",
    ),
    "background": ({"background": True}, 400, "background"),
    "an empty input": ({"input": []}, 400, "input"),
    "max_output_tokens 0": ({"max_output_tokens": 0}, 400, "max_output_tokens"),
    "too many tokens": ({"max_output_tokens": 5000}, 400, "max_output_tokens"),
    "a bad schema": (
        {"text": {"format": {"type": "json_schema", "name": "x",
                             "schema": {"type": "strng"}}}}, 400, "response_format",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD)
def test_a_bad_request_is_an_openai_error(qwen3_serve, case):
    fields, status, param = BAD[case]
    body = {"model": MODEL, "input": "Hi", **fields}
    reply = httpx.post(f"{qwen3_serve.url}/v1/responses", json=body, timeout=HANG_S)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"].split(".str")[0] == param, error  # a union's branch after ".str"
    assert httpx.get(f"{qwen3_serve.url}/health", timeout=HANG_S).status_code == 200


def test_the_store_forgets_the_least_recently_used_first():
    store = ResponseStore(2)
    for name in ("a", "b"):
        store.put(StoredResponse({"id": name}, []))
    assert store.get("a") is not None  # a use: b is now the oldest
    store.put(StoredResponse({"id": "c"}, []))
    assert store.get("b") is None and store.get("a") and store.get("c") and len(store) == 2
    assert store.delete("a") and not store.delete("a")
    empty = ResponseStore(0)
    empty.put(StoredResponse({"id": "a"}, []))
    assert len(empty) == 0
    assert cli.RESPONSES_STORE_SIZE == DEFAULT_SIZE


def test_a_router_with_a_store_of_two_forgets_the_oldest(qwen3_serve, qwen3_dir, router_logs):
    urls = {role: [w["url"] for w in qwen3_serve.workers(role)] for role in ("prefill", "decode")}
    router = RouterProc(qwen3_dir, router_logs, urls["prefill"], urls["decode"],
                        "--responses-store-size", "2")  # fmt: skip
    try:
        router.start().wait_ready()
        assert wait_until(
            lambda: httpx.get(f"{router.url}/health", timeout=HANG_S).status_code == 200
        )
        client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="unused", max_retries=0)
        made = [create(client) for _ in range(3)]
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(made[0].id)
        assert [client.responses.retrieve(r.id).id for r in made[1:]] == [r.id for r in made[1:]]
        client.responses.delete(made[2].id)  # the SDK's delete: no body to read
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(made[2].id)
    finally:
        router.stop()


@pytest.mark.slow
def test_no_generated_responses_request_gets_a_server_error(qwen3_serve):
    """Schemathesis' requests for the Responses routes, from the router's own OpenAPI
    description (as `test_schema_fuzz` does for the others)."""
    schema = schemathesis.openapi.from_url(f"{qwen3_serve.url}/openapi.json")
    found = [r.ok() for r in schema.get_all_operations()]
    ours = [op for op in found if op.path.startswith("/v1/responses")]
    assert {(op.method.upper(), op.path) for op in ours} == {
        ("POST", "/v1/responses"), ("GET", "/v1/responses/{response_id}"),
        ("DELETE", "/v1/responses/{response_id}"),
    }  # fmt: skip
    seen: dict[int, int] = {}
    for operation in ours:

        @given(case=operation.as_strategy())
        @settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))  # fmt: skip
        def call(case):
            reply = case.call(base_url=qwen3_serve.url, timeout=HANG_S)
            seen[reply.status_code] = seen.get(reply.status_code, 0) + 1
            assert reply.status_code < 500, (case.operation.path, case.body, reply.text[:300])

        call()
    assert seen.get(400, 0) > 0 and seen.get(404, 0) > 0
