"""Who may call what: client keys reach the OpenAI API, admin keys reach everything.

`require_client` guards `/v1/*`; `require_admin` guards `/admin/*` and the operator page
(`/ui`): mount a router with `dependencies=[Depends(require_admin)]` and it is closed to
players. Answers: 401 without a key or with an unknown one, 403 to a client key on the admin
API. With no admin keys configured, the admin API is served without a key only on the admin
listener (`auth.admin_port`, bound to `auth.admin_host`, loopback by default) or on a main
listener bound to loopback with no keys at all (the quickstart); anywhere else it is refused.

Keys are compared in constant time against every configured key (no early exit), given as
is or as `sha256:<hex>`; a presented key is never logged. `/livez`, `/readyz`, `/metrics`
and `/openapi.json` stay open.
"""

from __future__ import annotations

from starlette.requests import Request

from gateway.errors import OpenAIError
from gateway.http.access import presented_key
from gateway.state import app_state


def _missing() -> OpenAIError:
    return OpenAIError(
        401,
        "You didn't provide an API key (Authorization: Bearer <key>).",
        type="authentication_error",
        code="missing_api_key",
    )


def _invalid() -> OpenAIError:
    return OpenAIError(
        401, "Incorrect API key provided.", type="authentication_error", code="invalid_api_key"
    )


async def require_client(request: Request) -> None:
    """FastAPI dependency (and a plain call for fast routes): the OpenAI API's key check."""
    access = app_state(request).access
    if not access.any_keys:
        return
    key = presented_key(request)
    if key is None:
        raise _missing()
    if access.role_of(key) is None:
        raise _invalid()


async def require_admin(request: Request) -> None:
    """FastAPI dependency for the admin API and the operator page."""
    access = app_state(request).access
    key = presented_key(request)
    if key is not None:
        role = access.role_of(key)
        if role == "admin":
            return
        if role == "client":
            raise OpenAIError(
                403,
                "This key is a client key; the admin API needs an admin key.",
                type="permission_error",
                code="admin_key_required",
            )
        if not access.admin_without_key(request):
            raise _invalid()
    if access.admin_without_key(request):
        return
    if access.any_keys:
        raise _missing()
    raise OpenAIError(
        403,
        "The admin API is not served on this listener: set auth.admin_keys, or use the "
        "admin listener (auth.admin_port, loopback).",
        type="permission_error",
        code="admin_not_served_here",
    )
