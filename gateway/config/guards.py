"""Settings of what protects the gateway: who may call what (`auth`), how much one key or one
player may take (`limits`), what one request may cost (`request_limits`) and what one
connection may hold (`server`). Nested under `Settings` (gateway/config/settings.py)."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from gateway.config.base import SettingError, StrictModel

_HASHED = re.compile(r"^sha256:[0-9a-f]{64}$")


def _check_keys(keys: list[str]) -> list[str]:
    for k in keys:
        if not k:
            raise SettingError("an API key must not be empty")
        if k.startswith("sha256:") and not _HASHED.match(k):
            raise SettingError("a hashed key is `sha256:` and 64 lowercase hex digits")
    return keys


class AuthSettings(StrictModel):
    """Two key sets. A key is given as is, or hashed as `sha256:<hex of sha256(key)>`
    (`printf %s KEY | sha256sum`, prefixed with `sha256:`).

    - `client_keys` reach the OpenAI API (`/v1/*`); admin keys do too.
    - `admin_keys` reach the admin API (`/admin/*`, the operator page `/ui`).
    - With no admin keys the admin API is served only on the admin listener
      (`admin_host:admin_port`, loopback by default), or on the main listener when that is
      bound to loopback and no client keys are set (the `make up` quickstart). On a public
      bind without admin keys and without an admin port it is not served at all.
    """

    client_keys: list[str] = Field(default_factory=list)
    admin_keys: list[str] = Field(default_factory=list)
    admin_host: str = "127.0.0.1"
    admin_port: int | None = Field(default=None, ge=0, le=65535)

    @field_validator("client_keys", "admin_keys")
    @classmethod
    def _valid_keys(cls, keys: list[str]) -> list[str]:
        return _check_keys(keys)


class BucketSettings(StrictModel):
    """One token-bucket family: requests per second (burst = `burst`, default one second's
    worth) and prompt tokens per minute (burst = one minute's worth). None: no limit."""

    requests_per_s: float | None = Field(default=None, gt=0)
    burst: float | None = Field(default=None, ge=1)
    prompt_tokens_per_min: int | None = Field(default=None, ge=1)

    @property
    def enabled(self) -> bool:
        return self.requests_per_s is not None or self.prompt_tokens_per_min is not None


class LimitSettings(StrictModel):
    """Rate limits per API key (one game server / studio) and per player (session key).
    Kept in Redis when `state.backend` is redis (every replica enforces one budget),
    in memory otherwise."""

    per_key: BucketSettings = Field(default_factory=BucketSettings)
    per_player: BucketSettings = Field(default_factory=BucketSettings)


class RequestLimits(StrictModel):
    """What one request may cost; each refused with a 400 naming the field."""

    max_prompt_tokens: int = Field(default=262_144, ge=1)  # estimated: characters / 4
    max_max_tokens: int = Field(default=65_536, ge=1)
    max_messages: int = Field(default=2_048, ge=1)
    max_json_depth: int = Field(default=64, ge=2)
    max_session_key_chars: int = Field(default=256, ge=1)


class ServerLimits(StrictModel):
    """What one client connection may hold (gateway/http/listener.py)."""

    max_header_bytes: int = Field(default=64 * 1024, ge=1024)  # request line + headers
    header_timeout_s: float = Field(default=10.0, gt=0)  # connect/first byte -> headers done
    body_timeout_s: float = Field(default=30.0, gt=0)  # longest wait for the next body piece
    # idle between requests; above clients' pool expiry (httpx and so the OpenAI SDK 5 s,
    # aiohttp 15 s), so the client always drops an idle connection first: a server that
    # closes first races a request the client is already writing (a reset, nothing logged)
    keep_alive_s: float = Field(default=75.0, gt=0)
    max_connections: int = Field(default=4096, ge=1)  # beyond: closed at once
