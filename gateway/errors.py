"""Errors in the OpenAI shape `{"error": {"message", "type", "param", "code"}}`, with the status
codes and retry headers the OpenAI SDK acts on (a client's mistake is never a 5xx; a 5xx a
retry cannot fix says `x-should-retry: false`)."""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from contracts.errors import ApiError

log = logging.getLogger("warmgate.errors")


class OpenAIError(ApiError):
    """An error answered to the client as an OpenAI-shaped JSON body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self) -> Response:
        # ASCII JSON: a message quoting the client's input (a lone surrogate in a model name)
        # must still encode
        content = json.dumps(self.body()).encode()
        return Response(
            content, status_code=self.status, headers=self.headers, media_type="application/json"
        )


def error_body(
    message: str, type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def sse_error_event(message: str, type: str = "server_error", code: str | None = None) -> bytes:
    """The SSE frame that ends a stream which failed after its first byte."""
    return b"data: " + json.dumps(error_body(message, type, None, code)).encode() + b"\n\n"


def bad_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def model_not_found(model: str) -> OpenAIError:
    return OpenAIError(
        404,
        f"The model `{model}` does not exist or is not served by any instance.",
        param="model",
        code="model_not_found",
    )


def body_too_large(limit: int) -> OpenAIError:
    return OpenAIError(
        413, f"Request body exceeds the limit of {limit} bytes.", code="request_too_large"
    )


def no_healthy_instance(model: str, retry_after_s: int) -> OpenAIError:
    return OpenAIError(
        503,
        f"No healthy instance can serve model `{model}` right now; retry shortly.",
        type="server_error",
        code="no_healthy_instance",
        headers={"retry-after": str(retry_after_s)},
    )


def bad_gateway(message: str, *, should_retry: bool) -> OpenAIError:
    return OpenAIError(
        502,
        message,
        type="server_error",
        code="upstream_error",
        headers={"x-should-retry": "true" if should_retry else "false"},
    )


_STATUS_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


def install_error_handlers(app: FastAPI) -> None:
    """Every error the app answers, ours or the framework's, in the OpenAI shape."""

    async def on_openai_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, OpenAIError)
        return exc.response()

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        status = exc.status_code
        err = OpenAIError(
            status,
            str(exc.detail),
            type=_STATUS_TYPES.get(status, "server_error" if status >= 500 else "invalid_request"),
            code="not_found" if status == 404 else None,
            headers=dict(exc.headers or {}),
        )
        return err.response()

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error: %r", exc)
        # uvicorn drops the connection after an exception reaches it: say so, or a pooled
        # client reuses it and its next request fails with a reset
        return OpenAIError(
            500,
            "Internal error in the gateway.",
            type="server_error",
            code="internal_error",
            headers={"x-should-retry": "false", "connection": "close"},
        ).response()

    async def on_client_gone(request: Request, exc: Exception) -> Response:
        log.info("client went away before its request was read")
        return Response(status_code=499)  # never reaches the client; the access log says 499

    app.add_exception_handler(OpenAIError, on_openai_error)
    app.add_exception_handler(ClientDisconnect, on_client_gone)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)
