"""The HTTP conventions every Tandem server shares (router and nodes): errors in OpenAI's
shape, whatever raised them, and how long an idle connection stays open."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

# How long a node keeps an idle HTTP connection open. The router's pool keeps its own for
# less (`tandem.router.app.WORKER_KEEPALIVE_S`), so it never sends on one being closed; and
# long enough that the router's connections outlive the gaps in bursty traffic (uvicorn's
# 5 s did not: each burst after a 3 s pause opened new connections to the decode nodes).
KEEP_ALIVE_S = 75


def error_body(
    message: str,
    status: int,
    kind: str = "invalid_request_error",
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """An OpenAI-style error response."""
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": param, "code": status}},
        status_code=status,
        headers=headers,
    )


def add_validation_handler(app: FastAPI) -> None:
    """Answer a body that fails validation with a 400 in OpenAI's error shape (not 422)."""

    @app.exception_handler(RequestValidationError)
    async def invalid(_request, exc: RequestValidationError) -> Response:
        errors = exc.errors()
        detail = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in errors)
        param = ".".join(str(p) for p in errors[0]["loc"][1:]) if errors else None
        return error_body(detail, 400, param=param or None)


_HTTP_ERROR_KINDS = {
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
}


def add_http_error_handler(app: FastAPI) -> None:
    """Answer an unknown route (404), a wrong method (405) and every other HTTP error the
    framework raises in the same OpenAI error shape as the node's own errors, not
    FastAPI's `{"detail": ...}` (a 405 keeps its `Allow` header)."""

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request, exc: StarletteHTTPException) -> Response:
        kind = _HTTP_ERROR_KINDS.get(exc.status_code, "invalid_request_error")
        if exc.status_code >= 500:
            kind = "server_error"
        return error_body(str(exc.detail), exc.status_code, kind, headers=exc.headers)
