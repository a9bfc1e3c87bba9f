"""Schemathesis generates requests from the router's own OpenAPI description (valid and
invalid bodies alike) against a real `tandem serve`: none may get a 5xx.

The strategies are drawn with Hypothesis directly (schemathesis' pytest plugin does not
work with this pytest)."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.bounds import HANG_S

EXAMPLES = 20  # per operation


def operations(url: str) -> list:
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    return [result.ok() for result in schema.get_all_operations()]


def test_the_description_covers_the_api(serve):
    paths = {(op.method.upper(), op.path) for op in operations(serve.url)}
    assert {("POST", "/v1/completions"), ("POST", "/v1/chat/completions")} <= paths
    assert {("POST", "/tokenize"), ("POST", "/detokenize"), ("GET", "/v1/models")} <= paths


@pytest.mark.slow
def test_no_generated_request_gets_a_server_error(serve):
    seen: dict[int, int] = {}

    def fuzz(operation) -> None:
        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,  # the same cases every run: CI fails only on a real change
        )
        def call(case):
            response = case.call(base_url=serve.url, timeout=HANG_S)
            seen[response.status_code] = seen.get(response.status_code, 0) + 1
            assert response.status_code < 500, (operation.path, case.body, response.text[:300])

        call()

    for operation in operations(serve.url):
        fuzz(operation)
    assert seen.get(200, 0) > 0 and seen.get(400, 0) > 0  # both kinds were generated
