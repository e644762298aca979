"""The OpenAI-compatible API: `POST /v1/chat/completions`, `POST /v1/completions`,
`POST /v1/responses` (translated to a chat completion, gateway/http/responses_api.py),
`GET /v1/models` (the union of the healthy instances' models).

The completion endpoints are fast routes of `GatewayApp` (gateway/http/asgi_app.py) that
check the API key themselves: they skip FastAPI's middleware stack and per-route machinery
(dependency solving, the endpoint wrapper), about a fifth of the gateway's CPU per proxied
request for nothing they need. Errors still go through the app's
exception handlers, as for every other route.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gateway.errors import OpenAIError
from gateway.http.asgi_app import GatewayApp
from gateway.http.limits import enforce
from gateway.http.proxy import proxy_completion
from gateway.http.responses_api import answer, prepare
from gateway.http.roles import require_client
from gateway.pipeline.parse import Kind, decode_json_object, parse_chat, parse_completion, read_body
from gateway.pipeline.priority import read_priority
from gateway.state import AppState, app_state

_PATHS: dict[Kind, str] = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}


async def _serve(request: Request, kind: Kind, responses: bool = False) -> Response:
    state = app_state(request)
    request_id = str(request.state.request_id)
    try:
        settings = state.settings
        raw = await read_body(request, settings.max_body_bytes, settings.server.body_timeout_s)
        limits = settings.request_limits
        body, fast_json = decode_json_object(raw, limits)
        priority, stripped = read_priority(request.headers, body, settings.priority)
        if stripped is not None:  # a class-named `priority` is ours, not the engine's
            body, raw = stripped, b""
        call = None
        if responses:  # the Responses API, served as a chat completion
            body, call = await prepare(body, limits, state.responses)
            raw = b""
        session_header = request.headers.get("x-session-id")
        parse = parse_chat if kind == "chat" else parse_completion
        parsed = parse(body, session_header, raw, fast_json, limits)
        await enforce(state.limits, request, parsed)
        if state.warmer is not None:  # world versions (gateway/pipeline/world_replicate.py)
            state.warmer.note(parsed, request.headers)
        served = await proxy_completion(
            state,
            request,
            parsed,
            _PATHS[kind],
            request_id,
            priority,
            report_after_send=call is None,  # a Responses answer is translated first
        )
        return served if call is None else await answer(call, served)
    except OpenAIError as err:
        _count_refusal(state, err)
        raise


def _count_refusal(state: AppState, err: OpenAIError) -> None:
    """Requests refused before any attempt: the client's mistakes, or nothing to serve them."""
    if err.status == 502:
        return  # counted by the proxy as upstream_error
    outcome = "client_error" if err.status < 500 else "unavailable"
    state.metrics.requests.labels(outcome).inc()
    state.stats.outcomes[outcome] += 1


def _endpoint(kind: Kind, responses: bool = False) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        await require_client(request)
        return await _serve(request, kind, responses)

    return endpoint


def add_completion_routes(app: GatewayApp) -> None:
    for kind, path in _PATHS.items():
        app.add_fast_route(path, _endpoint(kind))
    app.add_fast_route("/v1/responses", _endpoint("chat", responses=True))


def build_openai_router() -> APIRouter:
    """`GET /v1/models` (mounted behind the API-key dependency)."""
    router = APIRouter()

    @router.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        state = app_state(request)
        created = int(state.started_at)
        data = [
            {"id": m, "object": "model", "created": created, "owned_by": "warmgate"}
            for m in state.health.healthy_models()
        ]
        return JSONResponse({"object": "list", "data": data})

    return router
