"""The request id in every log line about a request, in every process.

The router takes the client's `x-request-id` (or makes one), answers with it in the
`x-request-id` header, and passes it on: to the decode node as the same HTTP header, to the
prefill node inside the `PrefillRequest` message. Each process holds it in a context
variable while it works on that request (an HTTP handler's task and the tasks it starts,
a call handed to the engine thread, the engine's per-request work), and a logging filter
writes it into every line as `[id]` (`-` outside any request).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from contextvars import ContextVar

HEADER = "x-request-id"
FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"
MAX_LEN = 128
NONE = "-"

# A context variable, not a global: each task and thread sees its own value.
_request_id: ContextVar[str] = ContextVar("tandem_request_id", default=NONE)


def current() -> str | None:
    """The id of the request being worked on here, or None."""
    value = _request_id.get()
    return None if value == NONE else value


@contextlib.contextmanager
def request_context(request_id: str | None) -> Iterator[None]:
    """Log lines written inside carry `request_id` (None: leave the current one)."""
    if request_id is None:
        yield
        return
    token = _request_id.set(request_id)
    try:
        yield
    finally:
        _request_id.reset(token)


def set_request_id(request_id: str) -> None:
    """Make `request_id` current for the rest of this task (an ASGI request's task)."""
    _request_id.set(request_id)


def clean(value: str | None) -> str | None:
    """A client's id if it is usable in a header and a log line (printable ASCII, at most
    MAX_LEN characters, no spaces), else None."""
    if not value or len(value) > MAX_LEN:
        return None
    if not all(33 <= ord(c) < 127 for c in value):
        return None
    return value


class RequestIdFilter(logging.Filter):
    """Adds `request_id` to every record (for FORMAT)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = _request_id.get()
        return True


def configure_logging(level: str) -> None:
    """The process's log format, with the request id on every line."""
    logging.basicConfig(level=level.upper(), format=FORMAT)
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RequestIdFilter) for f in handler.filters):
            handler.addFilter(RequestIdFilter())
