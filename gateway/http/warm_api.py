"""`POST /v1/warm` (a client key, as for completions): warm a session's prompt on the instance
its next turn will be routed to (gateway/pipeline/warm.py).

The body is a chat completions body (`model`, `messages`) or a completions one (`prompt`),
with the session key as the completion endpoints take it (`prompt_cache_key`, `user` or the
`X-Session-Id` header): a warm without one is a 400, since nothing would tie the next turn to
the warmed instance. The answer is 200 JSON `{"instance", "prompt_tokens", "cached_tokens"
(before warming), "warmed_tokens", "source": "held" | "tierd" | "engine", "ms"}`; 429 with
Retry-After when the instance is busy with real work (a warm never delays it); 404 for an
unknown model and 503 when no instance is healthy, as for completions.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse
from starlette.requests import Request
from starlette.responses import Response

from gateway.errors import OpenAIError, bad_request
from gateway.http.asgi_app import GatewayApp
from gateway.http.limits import enforce
from gateway.http.roles import require_client
from gateway.pipeline.parse import decode_json_object, parse_chat, parse_completion, read_body
from gateway.pipeline.priority import read_priority
from gateway.state import app_state

WARM_PATH = "/v1/warm"
_FORWARD = ("authorization", "openai-organization", "openai-project")


async def warm_endpoint(request: Request) -> Response:
    await require_client(request)
    state = app_state(request)
    settings = state.settings
    if state.warmer is None or not settings.warm.enabled:
        raise OpenAIError(404, "Warming is disabled on this gateway.", code="warm_disabled")
    raw = await read_body(request, settings.max_body_bytes, settings.server.body_timeout_s)
    limits = settings.request_limits
    body, fast_json = decode_json_object(raw, limits)
    _, stripped = read_priority(request.headers, body, settings.priority)  # a warm is last
    if stripped is not None:
        body = stripped
    session_header = request.headers.get("x-session-id")
    if "messages" in body or "prompt" not in body:
        parsed = parse_chat(body, session_header, b"", fast_json, limits)
    else:
        parsed = parse_completion(body, session_header, b"", fast_json, limits)
    if parsed.session_key is None:
        raise bad_request(
            "A warm needs a session key (`prompt_cache_key`, `user` or the X-Session-Id "
            "header): the next turn finds the warmed instance through it.",
            param="prompt_cache_key",
            code="missing_session_key",
        )
    await enforce(state.limits, request, parsed)
    forward = {}
    if not state.access.any_keys:  # the client's key is the gateway's when it has keys
        forward = {n: v for n in _FORWARD if (v := request.headers.get(n)) is not None}
    forward["x-request-id"] = str(request.state.request_id)
    state.warmer.note(parsed, request.headers)  # an announced world version, if any
    result = await state.warmer.warm(parsed, forward)
    return JSONResponse(result.to_dict())


def add_warm_route(app: GatewayApp) -> None:
    app.add_fast_route(WARM_PATH, warm_endpoint)
