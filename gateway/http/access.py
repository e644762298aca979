"""Who may call what: the gateway's key sets (client and admin, plain or as sha256 digests) and
its listeners, built once per app from its settings (gateway/app.py) and kept on its state;
gateway/http/roles.py checks requests against them."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Iterable
from typing import Literal

from starlette.requests import Request

from gateway.config.settings import Settings

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


def presented_key(request: Request) -> bytes | None:
    for name, value in request.scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            token = bytes(token).strip()
            if bytes(scheme).lower() != b"bearer" or not token:
                return None
            return token
    return None
