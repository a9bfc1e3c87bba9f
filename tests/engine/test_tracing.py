"""`tandem.engine.telemetry.tracing` alone: off without an endpoint (no SDK loaded, no spans, no
carriers), and on with an exporter: a span's carrier makes the next span its child, as the
router, decode and prefill processes do across HTTP and ZMQ."""

from __future__ import annotations

import os
import subprocess
import sys

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tandem.engine.telemetry import tracing
from tandem.engine.telemetry.tracing import Tracing
from tests.bounds import PROCESS_S

OFF = """
import sys
from tandem.engine.telemetry import tracing
t = tracing.Tracing("x", None)
assert not t.enabled and t.provider is None
assert t.start("a", {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}) is None
with t.span("b") as span:
    assert span is None and tracing.current_carrier() == {}
assert tracing.carrier(None) == {}
t.shutdown()
assert "opentelemetry.sdk" not in sys.modules, "the SDK was loaded"
print("off")
"""


def test_without_an_endpoint_tracing_is_off_and_loads_no_sdk():
    env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": ""}
    out = subprocess.run(
        [sys.executable, "-P", "-c", OFF], capture_output=True, text=True, timeout=PROCESS_S,
        env={**os.environ, **env},
    )  # fmt: skip
    assert out.returncode == 0 and out.stdout.strip() == "off", out.stderr


def test_a_carrier_makes_the_next_span_a_child_in_the_same_trace():
    exporter = InMemorySpanExporter()
    t = Tracing("tandem-test", None, exporter=exporter)
    with t.span("router", **{"tandem.request_id": "r-1"}) as root:
        headers = tracing.current_carrier()
    assert set(headers) == {"traceparent"}
    child = t.start("decode", headers, **{"tandem.request_id": "r-1", "skipped": None})
    tracing.end(child, **{"tandem.finish_reason": "stop"})
    t.shutdown()  # flushes the batch
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert spans.keys() == {"router", "decode"}
    decode = spans["decode"]
    assert decode.context.trace_id == root.get_span_context().trace_id
    assert decode.parent.span_id == root.get_span_context().span_id
    assert dict(decode.attributes) == {"tandem.request_id": "r-1", "tandem.finish_reason": "stop"}
    assert decode.resource.attributes["service.name"] == "tandem-test"
