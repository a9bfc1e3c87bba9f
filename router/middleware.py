"""The router's ASGI middleware: request ids, the API-key check, the per-endpoint counter."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from tandem.engine.telemetry import request_log
from tandem.router.errors import APIError, shaped_for

if TYPE_CHECKING:
    from tandem.router.app import Router

# Paths that need the API key when keys are configured.
_PROTECTED = ("/v1/", "/tokenize", "/detokenize", "/workers")


class AuthAndCount:
    """ASGI middleware: the request id (the client's `x-request-id`, else a new one: in the
    response's header, the log lines, and `request.state.request_id`), the API-key check,
    and the per-endpoint status counter. Plain ASGI (not `BaseHTTPMiddleware`), so streams
    and disconnects pass through untouched."""

    def __init__(self, app, router: Router) -> None:
        self.app = app
        self.router = router

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        status = 500
        headers = dict(scope["headers"])
        given = request_log.clean(headers.get(request_log.HEADER.encode(), b"").decode("latin-1"))
        request_id = given or uuid.uuid4().hex
        scope.setdefault("state", {}).update(request_id=request_id, client_request_id=given)

        async def send_counted(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                own = (request_log.HEADER.encode(), request_id.encode())
                message["headers"] = [*message.get("headers", []), own]
            await send(message)

        try:
            with request_log.request_context(request_id):
                if path.startswith(_PROTECTED):
                    self.router.authorize(
                        headers.get(b"authorization", b"").decode("latin-1"),
                        headers.get(b"x-api-key", b"").decode("latin-1"),
                    )
                await self.app(scope, receive, send_counted)
        except APIError as exc:
            await shaped_for(path, exc)(scope, receive, send_counted)
        finally:
            m = self.router.metrics
            handler = _handler(path)
            m.child(m.requests, handler=handler, status=str(status)).inc()


_ENDPOINTS = frozenset(
    ("/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages",
     "/v1/messages/count_tokens", "/v1/models", "/tokenize", "/detokenize", "/health",
     "/metrics", "/workers")
)  # fmt: skip


def _handler(path: str) -> str:
    """The `handler` label of a path: one of the router's, ids left out, else "other"."""
    if path in _ENDPOINTS:
        return path
    return "/v1/responses/{id}" if path.startswith("/v1/responses/") else "other"
