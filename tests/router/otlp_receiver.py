"""An OTLP/HTTP trace receiver on 127.0.0.1 for the tests: it decodes every
`ExportTraceServiceRequest` the processes under test post and keeps their spans."""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root
    attributes: dict[str, Any]


def _value(v: AnyValue) -> Any:
    return getattr(v, v.WhichOneof("value")) if v.WhichOneof("value") else None


def _span(service: str, s: Any) -> Span:
    attributes = {a.key: _value(a.value) for a in s.attributes}
    ids = (s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex())
    return Span(service, s.name, *ids, attributes)


def decode(body: bytes) -> list[Span]:
    request = ExportTraceServiceRequest.FromString(body)
    spans = []
    for resource in request.resource_spans:
        service = {a.key: _value(a.value) for a in resource.resource.attributes}["service.name"]
        for scope in resource.scope_spans:
            spans += [_span(service, s) for s in scope.spans]
    return spans


class OTLPReceiver:
    """`with OTLPReceiver() as r:` serves `r.endpoint` until the block ends."""

    def __init__(self) -> None:
        self._spans: list[Span] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                found = decode(body)
                with receiver._lock:
                    receiver._spans += found
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"

    def spans(self) -> list[Span]:
        with self._lock:
            return list(self._spans)

    def __enter__(self) -> OTLPReceiver:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
