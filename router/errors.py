"""The router's errors: each knows its HTTP status and becomes an OpenAI error body."""

from __future__ import annotations

import re

from fastapi.responses import JSONResponse

from tandem.engine.api.http import error_body


class APIError(Exception):
    """An error the client caused or must wait out; never a 500 (but `RouterFault`)."""

    status = 400
    kind = "invalid_request_error"

    def __init__(
        self, message: str, param: str | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.retry_after = retry_after

    @property
    def reason(self) -> str:
        """The class name in snake case: the `reason` label of
        `tandem_router_request_failures_total` (`StreamBroken` -> `stream_broken`)."""
        return re.sub(r"(?<!^)(?=[A-Z])", "_", type(self).__name__).lower()

    def response(self) -> JSONResponse:
        headers = None
        if self.retry_after is not None:
            headers = {"Retry-After": str(max(1, round(self.retry_after)))}
        return error_body(self.message, self.status, self.kind, self.param, headers)


class InvalidRequest(APIError):
    status = 400


class Unauthorized(APIError):
    status = 401
    kind = "authentication_error"


class ModelNotFound(APIError):
    status = 404
    kind = "not_found_error"


class TooManyRequests(APIError):
    status = 429
    kind = "rate_limit_error"


class Unavailable(APIError):
    """No worker can take the request now (503 with Retry-After)."""

    status = 503
    kind = "service_unavailable"


class UpstreamFailed(APIError):
    """Workers failed the request after the router's retries."""

    status = 502
    kind = "server_error"


class RouterFault(APIError):
    """A fault of the router's own while streaming an answer (a bug): the stream ends with
    it as an error event, then `[DONE]`, rather than breaking off."""

    status = 500
    kind = "server_error"


class ResponseNotFound(APIError):
    """A Responses API id this router does not hold (OpenAI's 404 for it is an
    `invalid_request_error`)."""

    status = 404


# Anthropic's error types by status (https://docs.anthropic.com/en/api/errors).
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def anthropic_error_type(status: int) -> str:
    return _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def anthropic_error(
    status: int, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    """Anthropic's error body: `{"type": "error", "error": {"type", "message"}}`."""
    body = {"type": "error", "error": {"type": anthropic_error_type(status), "message": message}}
    return JSONResponse(body, status_code=status, headers=headers)


def shaped_for(path: str, exc: APIError) -> JSONResponse:
    """`exc` in the error shape of the API `path` belongs to (Anthropic's or OpenAI's)."""
    if not is_anthropic(path):
        return exc.response()
    response = exc.response()
    headers = {"Retry-After": response.headers["Retry-After"]} if exc.retry_after else None
    return anthropic_error(exc.status, exc.message, headers)


def is_anthropic(path: str) -> bool:
    return path == "/v1/messages" or path.startswith("/v1/messages/")
