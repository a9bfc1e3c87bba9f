"""OpenTelemetry traces of a request across router, decode and prefill processes.

Each process makes one `Tracing` from its `--otlp-traces-endpoint` flag (default
`$OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`). With an endpoint it owns a tracer provider that
batches spans to that OTLP/HTTP endpoint (`http://host:4318/v1/traces`); without one it
is off: no provider, no exporter, `opentelemetry.sdk` never imported, and every method
returns at once (no span objects, empty carriers). The provider is this object's, never
the process-wide global one.

One trace per request: the router's span is the root; its context travels in W3C
`traceparent`/`tracestate` headers to the decode node and inside `PrefillRequest.trace`
over ZMQ to the prefill node, whose spans are children of the decode node's. Every span
carries the request id (`tandem.request_id`, the `x-request-id`) as an attribute.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
Carrier = dict[str, str]
_PROPAGATOR = TraceContextTextMapPropagator()  # stateless: W3C trace context only


def add_tracing_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--otlp-traces-endpoint",
        default=os.environ.get(ENV) or None,
        help="send OpenTelemetry traces to this OTLP/HTTP endpoint, e.g. "
        f"http://collector:4318/v1/traces (default: ${ENV}; none: tracing off)",
    )


class Tracing:
    """A tracer for one process (`service` names it), or nothing when `endpoint` is None.
    `provider` (an SDK TracerProvider, None when off) is owned here: `shutdown()` flushes
    it."""

    @classmethod
    def off(cls) -> Tracing:
        return cls("", None)

    def __init__(self, service: str, endpoint: str | None, exporter: Any = None) -> None:
        """`exporter` replaces the OTLP one (tests); it turns tracing on by itself."""
        self.provider = None
        self.tracer: trace.Tracer | None = None
        if endpoint is None and exporter is None:
            return
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter(endpoint=endpoint)
        self.provider = TracerProvider(resource=Resource.create({"service.name": service}))
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("tandem")

    @property
    def enabled(self) -> bool:
        return self.tracer is not None

    def start(
        self, name: str, parent: Mapping[str, str] | None = None, **attributes: Any
    ) -> trace.Span | None:
        """A started span (the caller ends it), child of the context in `parent` (a
        carrier), else of the current span; None when tracing is off."""
        if self.tracer is None:
            return None
        context = _PROPAGATOR.extract(parent) if parent else None
        attrs = {k: v for k, v in attributes.items() if v is not None}
        return self.tracer.start_span(name, context=context, attributes=attrs)

    @contextlib.contextmanager
    def span(
        self, name: str, parent: Mapping[str, str] | None = None, **attributes: Any
    ) -> Iterator[trace.Span | None]:
        """`start` as a context manager that makes the span current (so spans and
        carriers made inside are its children) and ends it."""
        span = self.start(name, parent, **attributes)
        if span is None:
            yield None
            return
        with trace.use_span(span, end_on_exit=True):
            yield span

    def shutdown(self) -> None:
        """Export what is queued and stop (at process exit)."""
        if self.provider is not None:
            self.provider.shutdown()


def carrier(span: trace.Span | None) -> Carrier:
    """The W3C headers naming `span` as the parent; {} for None."""
    if span is None or not span.get_span_context().is_valid:
        return {}
    out: Carrier = {}
    _PROPAGATOR.inject(out, context=trace.set_span_in_context(span))
    return out


def current_carrier() -> Carrier:
    """The W3C headers naming the current span (this task's or thread's); {} without one."""
    return carrier(trace.get_current_span())


def end(span: trace.Span | None, **attributes: Any) -> None:
    """Set `attributes` (None values skipped) and end `span`, if there is one."""
    if span is None:
        return
    for key, value in attributes.items():
        if value is not None:
            span.set_attribute(key, value)
    span.end()


def from_headers(headers: Mapping[str, str]) -> Carrier:
    """The trace-context headers of an HTTP request, as a carrier."""
    return {k: headers[k] for k in ("traceparent", "tracestate") if k in headers}
