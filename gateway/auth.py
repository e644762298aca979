"""API keys: when `api_keys` is configured, the OpenAI API and the admin API require
`Authorization: Bearer <key>` (401 `invalid_api_key` otherwise, which the OpenAI SDK raises
as AuthenticationError). Keys are compared in constant time. `/livez`, `/readyz` and
`/metrics` stay open for probes and scrapers. Without keys the gateway is open and passes
the client's `Authorization` header on to the engines."""

from __future__ import annotations

import hmac

from starlette.requests import Request

from gateway.errors import OpenAIError
from gateway.state import app_state


def _presented_key(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


async def require_api_key(request: Request) -> None:
    """FastAPI dependency: refuse the request unless it carries a configured key."""
    keys = app_state(request).settings.api_keys
    if not keys:
        return
    presented = _presented_key(request)
    if presented is None:
        raise OpenAIError(
            401,
            "You didn't provide an API key (Authorization: Bearer <key>).",
            code="missing_api_key",
        )
    if not any(hmac.compare_digest(presented.encode(), k.encode()) for k in keys):
        raise OpenAIError(401, "Incorrect API key provided.", code="invalid_api_key")
