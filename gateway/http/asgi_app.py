"""`GatewayApp`: FastAPI, with the completion endpoints served ahead of its middleware stack.

Starlette's and FastAPI's layers (error middleware, telemetry, body limit, exception
middleware, exit stack, router, route wrapper, each wrapping every `send`) cost about a fifth
of the gateway's CPU per proxied request (py-spy). A route added with `add_fast_route()` skips them
and gets what they would have given it: the app's exception handlers for what the endpoint
raises, and for anything unexpected the app's 500 answer then the exception re-raised to the
server (as Starlette's ServerErrorMiddleware does). Every other request, and any app mounted
under a root path, takes the usual stack. The gateway's own middleware (request ids and
access logs) is one explicit stack, built in `create_app`, around both.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from contracts.errors import ConfigurationError
from gateway.http.middleware import RequestIdMiddleware

Endpoint = Callable[[Request], Awaitable[Response]]


Middleware = Callable[[ASGIApp], ASGIApp]


class MiddlewareOutsideStackError(ConfigurationError, RuntimeError):
    """A middleware added with `add_middleware` instead of `GatewayApp(stack=...)`."""


class GatewayApp(FastAPI):
    """`stack`: the gateway's own middleware, outermost first, applied once around both the
    fast routes and FastAPI's stack (so nothing can be wired for one path and skipped on the
    other). `add_middleware` is refused: a middleware goes into `stack`, in `create_app`."""

    def __init__(self, *, stack: Sequence[Middleware] = (RequestIdMiddleware,), **kwargs: Any):
        super().__init__(**kwargs)
        self._fast_routes: dict[str, Endpoint] = {}
        outer: ASGIApp = self._dispatch
        for middleware in reversed(stack):
            outer = middleware(outer)
        self._outer = outer

    def add_middleware(self, *args: Any, **kwargs: Any) -> None:
        raise MiddlewareOutsideStackError(
            "GatewayApp's middleware is its explicit stack (GatewayApp(stack=...) in "
            "create_app): it wraps the fast routes too, which add_middleware would skip"
        )

    def add_fast_route(self, path: str, endpoint: Endpoint) -> None:
        """Serve `POST path` with `endpoint` ahead of the middleware stack (it is also a
        route of the usual stack, which answers other methods with a 405)."""
        self.add_route(path, endpoint, methods=["POST"], include_in_schema=False)
        self._fast_routes[path] = endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._outer(scope, receive, send)

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and scope["path"] in self._fast_routes
            and not self.root_path
            and not scope.get("root_path")
        ):
            scope["app"] = self
            await self._serve_fast(scope, receive, send)
            return
        await super().__call__(scope, receive, send)

    async def _serve_fast(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive, send)
        try:
            response = await self._fast_routes[scope["path"]](request)
        except Exception as exc:
            handler, unexpected = self._handler_for(exc)
            if handler is None:
                raise
            answer = handler(request, exc)
            response = await answer if inspect.isawaitable(answer) else answer
            await response(scope, receive, send)
            if unexpected:
                raise  # the server logs it, as behind ServerErrorMiddleware
            return
        await response(scope, receive, send)

    def _handler_for(self, exc: Exception) -> tuple[Callable[..., Any] | None, bool]:
        """The app's handler for `exc` (most specific class first) and whether it is the
        catch-all one."""
        for cls in type(exc).__mro__:
            if cls is Exception:
                break
            handler = self.exception_handlers.get(cls)
            if handler is not None:
                return handler, False
        return self.exception_handlers.get(Exception), True
