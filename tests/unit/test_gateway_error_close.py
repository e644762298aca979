"""After an unexpected error the server drops the connection, so the 500 says
`Connection: close` (a pooled client must not reuse it), on the fast routes and the usual
stack alike; and an error message quoting a lone surrogate still encodes."""

from __future__ import annotations

from fastapi.testclient import TestClient
from starlette.requests import Request
from starlette.responses import Response

from gateway.errors import OpenAIError, install_error_handlers
from gateway.http.asgi_app import GatewayApp


def _app() -> GatewayApp:
    app = GatewayApp()
    install_error_handlers(app)

    async def boom(request: Request) -> Response:
        raise RuntimeError("unexpected")

    async def surrogate(request: Request) -> Response:
        raise OpenAIError(404, "The model `\ud800` does not exist.", param="model")

    app.add_fast_route("/fast", boom)
    app.add_route("/slow", boom, methods=["GET"])
    app.add_route("/surrogate", surrogate, methods=["GET"])
    return app


def test_unexpected_500_closes_the_connection() -> None:
    with TestClient(_app(), raise_server_exceptions=False) as client:
        for method, path in (("POST", "/fast"), ("GET", "/slow")):
            r = client.request(method, path)
            assert r.status_code == 500
            assert r.headers["connection"] == "close"
            assert r.headers["x-should-retry"] == "false"
            assert r.json()["error"]["code"] == "internal_error"


def test_error_quoting_a_lone_surrogate_is_json() -> None:
    with TestClient(_app(), raise_server_exceptions=False) as client:
        r = client.get("/surrogate")
        assert r.status_code == 404
        assert r.headers["content-type"] == "application/json"
        assert r.json()["error"]["param"] == "model"
