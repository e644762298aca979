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

import hashlib
import hmac
import ipaddress
from collections.abc import Iterable
from typing import Literal

from starlette.requests import Request

from gateway.config.settings import Settings
from gateway.errors import OpenAIError
from gateway.state import AppState, app_state

Role = Literal["client", "admin"]
_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


class KeySet:
    """Keys in plain text or as sha256 digests; `matches` checks all of them."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._plain: list[bytes] = []
        self._digests: list[bytes] = []
        for k in keys:
            if k.startswith("sha256:"):
                self._digests.append(bytes.fromhex(k.removeprefix("sha256:")))
            else:
                self._plain.append(k.encode())

    def __bool__(self) -> bool:
        return bool(self._plain or self._digests)

    def matches(self, presented: bytes) -> bool:
        digest = hashlib.sha256(presented).digest()
        hit = False
        for k in self._plain:
            hit |= hmac.compare_digest(presented, k)
        for d in self._digests:
            hit |= hmac.compare_digest(digest, d)
        return hit


def is_loopback(host: str) -> bool:
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Access:
    """The gateway's key sets and listeners, built once per app from its settings."""

    def __init__(self, settings: Settings) -> None:
        auth = settings.auth
        self.clients = KeySet([*settings.api_keys, *auth.client_keys])
        self.admins = KeySet(auth.admin_keys)
        self.admin_port = auth.admin_port
        self.main_is_loopback = is_loopback(settings.host)

    @property
    def any_keys(self) -> bool:
        return bool(self.clients) or bool(self.admins)

    def role_of(self, presented: bytes) -> Role | None:
        # both sets are always checked: the time taken does not say which one matched
        admin = self.admins.matches(presented)
        client = self.clients.matches(presented)
        return "admin" if admin else "client" if client else None

    def on_admin_listener(self, request: Request) -> bool:
        server = request.scope.get("server")
        return self.admin_port is not None and server is not None and server[1] == self.admin_port

    def admin_without_key(self, request: Request) -> bool:
        if self.on_admin_listener(request):
            return True
        return not self.any_keys and self.main_is_loopback


def access_of(state: AppState) -> Access:
    if state.access is None:
        state.access = Access(state.settings)
    return state.access


def presented_key(request: Request) -> bytes | None:
    for name, value in request.scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            token = bytes(token).strip()
            if bytes(scheme).lower() != b"bearer" or not token:
                return None
            return token
    return None


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
    access = access_of(app_state(request))
    if not access.any_keys:
        return
    key = presented_key(request)
    if key is None:
        raise _missing()
    if access.role_of(key) is None:
        raise _invalid()


async def require_admin(request: Request) -> None:
    """FastAPI dependency for the admin API and the operator page."""
    access = access_of(app_state(request))
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
