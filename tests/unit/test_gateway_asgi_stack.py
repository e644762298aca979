"""The gateway's middleware is one explicit stack around every route: a middleware in it
sees the fast completion routes and FastAPI's usual stack alike, and `add_middleware`
(which would wrap only the usual stack) is refused."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.http.asgi_app import GatewayApp
from gateway.http.middleware import RequestIdMiddleware


class Tally:
    """A real middleware counting the HTTP requests it saw, by path."""

    seen: list[str]

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        Tally.seen.append("built")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            Tally.seen.append(scope["path"])
        await self.app(scope, receive, send)


async def ok(request: Request) -> Response:
    return PlainTextResponse("ok")


def test_one_stack_wraps_fast_and_usual_routes() -> None:
    Tally.seen = []
    app = GatewayApp(stack=(RequestIdMiddleware, Tally))
    app.add_fast_route("/fast", ok)
    app.add_route("/slow", ok, methods=["GET"])
    with TestClient(app) as client:
        fast = client.post("/fast", headers={"x-request-id": "npc-1"})
        slow = client.get("/slow", headers={"x-request-id": "npc-2"})
    assert (fast.text, slow.text) == ("ok", "ok")
    assert fast.headers["x-request-id"] == "npc-1" and slow.headers["x-request-id"] == "npc-2"
    assert Tally.seen == ["built", "/fast", "/slow"]  # built once, saw both paths


def test_add_middleware_is_refused() -> None:
    with pytest.raises(RuntimeError, match="explicit stack"):
        GatewayApp().add_middleware(RequestIdMiddleware)
