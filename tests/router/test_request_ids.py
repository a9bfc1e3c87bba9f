"""One request followed through real router, decode and prefill processes (HTTP, ZMQ,
NIXL): its `x-request-id` in the response header and in every log line each process writes
about it, and its OpenTelemetry spans, exported by each process over OTLP/HTTP to a
receiver in the test, forming one connected trace."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from tandem.engine.core.scheduler import prefill_job_key
from tests.bounds import HANG_S
from tests.disagg.nodes import Node, running, wait_until
from tests.router.conftest import RouterProc
from tests.router.otlp_receiver import OTLPReceiver

FLAGS = ("--max-model-len", "256", "--num-kv-blocks", "64", "--log-level", "info")


@pytest.fixture(scope="module")
def receiver():
    with OTLPReceiver() as receiver:
        yield receiver


class Traced(Node):
    def environment(self) -> dict[str, str]:
        return {"OTEL_BSP_SCHEDULE_DELAY": "100"}  # export spans within 0.1 s


class TracedRouter(RouterProc):
    def environment(self) -> dict[str, str]:
        return {"OTEL_BSP_SCHEDULE_DELAY": "100"}


@pytest.fixture(scope="module")
def trio(llama_dir, tmp_path_factory, receiver):
    logs = tmp_path_factory.mktemp("request-logs")
    otlp = ("--otlp-traces-endpoint", receiver.endpoint)
    p = Traced("prefill", llama_dir, logs, *FLAGS, *otlp)
    d = Traced("decode", llama_dir, logs, *FLAGS, *otlp)
    with running({"p": p, "d": d}) as nodes:
        router = TracedRouter(llama_dir, logs, [p.url], [d.url], "--log-level", "info", *otlp)
        try:
            router.start().wait_ready()
            assert wait_until(lambda: httpx.get(f"{router.url}/health").status_code == 200)
            yield {**nodes, "router": router}
        finally:
            router.stop()


def log_of(proc) -> str:
    return next(Path(proc.log_dir).glob(f"{proc.name}-{proc.http_port}.log")).read_text()


def complete(router: RouterProc, headers: dict[str, str]) -> httpx.Response:
    body = {"model": "llama", "prompt": "A tale of two cities " * 3, "max_tokens": 3}
    r = httpx.post(f"{router.url}/v1/completions", json=body, headers=headers, timeout=HANG_S)
    assert r.status_code == 200, r.text
    return r


def lines_about(text: str, request_id: str) -> list[str]:
    return [line for line in text.splitlines() if request_id in line]


def test_the_clients_request_id_is_echoed_and_in_every_processs_log_lines(trio):
    r = complete(trio["router"], {"x-request-id": "client-abc-123"})
    assert r.headers["x-request-id"] == "client-abc-123"
    internal = f"{r.json()['id']}-0"  # the choice's id downstream: unique, not the client's
    tagged = "[client-abc-123]"
    agent = httpx.get(f"{trio['d'].url}/health", timeout=HANG_S).json()["agent"]
    job = prefill_job_key(agent, "{id}", 1)  # the prefill worker's name for the attempt
    expected = {
        "router": ("request {id}: decode", "request {id}: length"),
        "d": ("request {id}: queued", "request {id}: remote prefill attempt 1",
              "request {id}: finished (length)"),
        "p": (f"prefill {job}: received", f"prefill {job}: done"),
    }  # fmt: skip
    for name, messages in expected.items():
        proc = trio[name]

        def logged(proc=proc, messages=messages) -> bool:
            text = log_of(proc)
            return all(m.format(id=internal) in text for m in messages)

        assert wait_until(logged), (name, log_of(proc)[-2000:])
        about = lines_about(log_of(proc), internal)
        assert len(about) >= len(messages)
        assert all(tagged in line for line in about), (name, about)
    # a line about no request carries no id
    assert re.search(r"\[-\] .*engine ready", log_of(trio["d"]))


def test_without_a_client_id_the_router_makes_one_and_names_the_response_after_it(trio):
    r = complete(trio["router"], {})
    request_id = r.headers["x-request-id"]
    assert r.json()["id"] == f"cmpl-{request_id}"
    internal = f"cmpl-{request_id}-0"
    assert wait_until(lambda: f"request {internal}: finished" in log_of(trio["d"]))
    for name in ("router", "d", "p"):
        about = lines_about(log_of(trio[name]), internal)
        assert about and all(f"[{request_id}]" in line for line in about), (name, about)


def test_an_unusable_client_id_is_replaced_and_errors_carry_the_id_too(trio):
    r = complete(trio["router"], {"x-request-id": "has spaces in it"})
    assert r.headers["x-request-id"] != "has spaces in it"
    assert r.json()["id"] == f"cmpl-{r.headers['x-request-id']}"
    bad = {"model": "llama", "prompt": "x", "max_tokens": -1}
    r = httpx.post(f"{trio['router'].url}/v1/completions", json=bad,
                   headers={"x-request-id": "bad-1"}, timeout=HANG_S)  # fmt: skip
    assert r.status_code == 400 and r.headers["x-request-id"] == "bad-1"


def test_tandem_serve_passes_the_otlp_endpoint_to_every_child():
    import argparse

    from tandem.router.serve import add_arguments, plan

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--prefill", "1", "--decode", "1",
                              "--otlp-traces-endpoint", "http://c:4318/v1/traces"])  # fmt: skip
    children = plan(args, Path("model"))
    assert [c.name for c in children] == ["prefill-0", "decode-0", "router"]
    for child in children:
        at = child.cmd.index("--otlp-traces-endpoint")
        assert child.cmd[at + 1] == "http://c:4318/v1/traces", child.name


SPANS = {
    "tandem.router.request": ("tandem-router", None),
    "tandem.router.choice": ("tandem-router", "tandem.router.request"),
    "tandem.decode.request": ("tandem-decode", "tandem.router.choice"),
    "tandem.decode.remote_prefill": ("tandem-decode", "tandem.decode.request"),
    "tandem.prefill.request": ("tandem-prefill", "tandem.decode.remote_prefill"),
    "tandem.prefill.kv_transfer": ("tandem-prefill", "tandem.prefill.request"),
}  # name -> (service, parent's name)


def test_one_disaggregated_request_is_one_connected_trace(trio, receiver):
    complete(trio["router"], {"x-request-id": "trace-me-1"})

    def spans() -> list:
        return [
            s for s in receiver.spans() if s.attributes.get("tandem.request_id") == "trace-me-1"
        ]

    assert wait_until(lambda: {s.name for s in spans()} >= SPANS.keys()), receiver.spans()
    found = spans()
    assert sorted(s.name for s in found) == sorted(SPANS), "one span of each, no more"
    assert len({s.trace_id for s in found}) == 1
    by_id = {s.span_id: s for s in found}
    for span in found:
        service, parent = SPANS[span.name]
        assert span.service == service, span
        if parent is None:
            assert span.parent_id == "", span
        else:
            assert by_id[span.parent_id].name == parent, span
    (choice,) = [s for s in found if s.name == "tandem.router.choice"]
    assert choice.attributes["tandem.finish_reason"] == "length"
    assert choice.attributes["tandem.phase.remote_prefill_s"] > 0
