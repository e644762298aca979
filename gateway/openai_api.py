"""The OpenAI-compatible API: `POST /v1/chat/completions`, `POST /v1/completions`,
`GET /v1/models` (the union of the healthy instances' models)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gateway.errors import OpenAIError
from gateway.parse import Kind, parse_chat, parse_completion, parse_json_object, read_body
from gateway.proxy import proxy_completion
from gateway.state import AppState, app_state

_PATHS: dict[Kind, str] = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}


async def _serve(request: Request, kind: Kind) -> Response:
    state = app_state(request)
    request_id = str(request.state.request_id)
    try:
        raw = await read_body(request, state.settings.max_body_bytes)
        body = parse_json_object(raw)
        session_header = request.headers.get("x-session-id")
        parsed = (
            parse_chat(body, session_header)
            if kind == "chat"
            else parse_completion(body, session_header)
        )
        return await proxy_completion(state, request, parsed, _PATHS[kind], request_id)
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


def build_openai_router() -> APIRouter:
    router = APIRouter()

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _serve(request, "chat")

    @router.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _serve(request, "completion")

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
