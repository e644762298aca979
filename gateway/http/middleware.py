"""Request ids and access logs, as a pure ASGI middleware (it never buffers a body, so SSE
streams pass through untouched): `x-request-id` is taken from the request (or generated),
put in the request-scoped log context and `request.state.request_id`, and echoed on every
response. One JSON access-log line per request, with its request id."""

from __future__ import annotations

import logging
import time
import uuid

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.observe.logs import REQUEST_ID

log = logging.getLogger("warmgate.access")

MAX_REQUEST_ID = 200
_QUIET = {"/livez", "/readyz", "/metrics"}


def _valid_request_id(value: str) -> bool:
    return 0 < len(value) <= MAX_REQUEST_ID and value.isprintable()


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = None
        for name, value in scope.get("headers", []):
            if name == b"x-request-id":
                given = value.decode("latin-1").strip()
                break
        request_id = given if given and _valid_request_id(given) else f"req_{uuid.uuid4().hex}"
        scope.setdefault("state", {})["request_id"] = request_id
        token = REQUEST_ID.set(request_id)
        started = time.monotonic()
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                MutableHeaders(scope=message)["x-request-id"] = request_id
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            path = scope.get("path", "")
            level = logging.DEBUG if path in _QUIET else logging.INFO
            if log.isEnabledFor(level):
                self._log(scope, path, level, status, started)
            REQUEST_ID.reset(token)

    @staticmethod
    def _log(scope: Scope, path: str, level: int, status: int, started: float) -> None:
        method = scope.get("method", "")
        log.log(
            level,
            "%s %s %s",
            method,
            path,
            status,
            extra={
                "method": method,
                "path": path,
                "status": status,
                "duration_s": round(time.monotonic() - started, 6),
            },
        )
