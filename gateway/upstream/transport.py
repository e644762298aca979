"""The transport seam: how the proxy talks to an engine, whatever client does the HTTP.

The proxy (gateway/http/proxy.py, gateway/upstream/relay.py, gateway/upstream/resume.py) sees only
`UpstreamTransport` and `UpstreamResponse`; `upstream.transport` picks the implementation
(`gateway.app.build_upstream` builds it):

- `h1pool`: the hand-written keep-alive pool on httptools (gateway/upstream/h1pool.py), the default;
- `aiohttp`: aiohttp's client (gateway/upstream/transport_aiohttp.py, the `transports` extra);
- `httpx`: httpx's AsyncClient (gateway/upstream/transport_httpx.py).

The contract, which tests/unit/test_transports.py holds every implementation to:
- `post()` sends one POST to a `Target` (`target_of(url)`) and returns once the response
  head arrived (within `head_s`, default `read_s`); the body is then read as it arrives
  with `aiter_bytes()` (each wait bounded by `read_s`, the first by `first_s`) or whole
  with `aread()`.
- `aclose()` on a response is always called (idempotent); a response read to its end gives
  its connection back for reuse, one closed before its end (the client left, a cancel) has
  its connection closed, and either way the connection's slot is free again.
- `abort(reason)` fails the read in progress, and every later one, with
  `UpstreamTimeout(reason)` (the health checker giving up on a hung engine).
- Failures are the exception classes below, never a library's own: `UpstreamTimeout`,
  `UpstreamConnectError` (could not connect, or the connection died before a response
  started), `UpstreamReadError` (a malformed response, or one cut short),
  `UpstreamLocalError` (the gateway ran out of descriptors or buffers). A header value with
  a line break is a `ValueError` before anything is sent.
"""

from __future__ import annotations

import errno
import functools
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

from contracts.errors import ConfigurationError, InputError
from contracts.errors import UpstreamError as WarmgateUpstreamError


class TransportError(WarmgateUpstreamError):
    """The upstream request failed (whichever transport carried it)."""


class UpstreamTimeout(TransportError):
    pass


class UpstreamConnectError(TransportError):
    pass


class UpstreamLocalError(TransportError):
    """The gateway itself ran out (file descriptors, buffers): no fault of the engine's."""


LOCAL_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class UpstreamReadError(TransportError):
    pass


class HeaderLineBreakError(InputError, ValueError):
    """A header value holding a line break (it would split the request)."""


class UnproxiedUrlError(ConfigurationError, ValueError):
    """An instance URL the transports cannot proxy to (only http:// is)."""


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect_s: float
    read_s: float
    write_s: float
    pool_s: float


@dataclass(frozen=True, slots=True)
class Target:
    """Where a request goes, parsed once per (instance, path)."""

    host: str
    port: int
    host_header: bytes
    path: bytes
    url: str

    @classmethod
    def parse(cls, url: str) -> Target:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise UnproxiedUrlError(f"only http:// URLs are proxied, not {url!r}")
        port = parts.port or 80
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        return cls(parts.hostname, port, parts.netloc.encode("idna"), path.encode("ascii"), url)


@functools.lru_cache(maxsize=4096)
def target_of(url: str) -> Target:
    """`url` parsed, once (instance URLs and paths are few and fixed)."""
    return Target.parse(url)


class Headers(Mapping[str, str]):
    """Response headers, names lower-cased; a repeated header reads as its values joined
    with ", " (as httpx does)."""

    def __init__(self, items: list[tuple[str, str]]) -> None:
        self._items = items
        self._map: dict[str, str] = {}
        for name, value in items:
            self._map[name] = f"{self._map[name]}, {value}" if name in self._map else value

    def __getitem__(self, name: str) -> str:
        return self._map[name.lower()]

    def __iter__(self) -> Iterator[str]:
        return iter(self._map)

    def __len__(self) -> int:
        return len(self._map)


def check_header_values(headers: Mapping[str, str]) -> None:
    """A header value with a line break would split the request: refuse it."""
    for name, value in headers.items():
        if "\r" in value or "\n" in value:
            raise HeaderLineBreakError(f"header {name!r} holds a line break")


class UpstreamResponse(Protocol):
    """One engine response, its head arrived, its body still to read."""

    @property
    def status_code(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    def aiter_bytes(
        self, read_s: float | None = None, first_s: float | None = None
    ) -> AsyncIterator[bytes]: ...

    async def aread(self) -> bytes: ...

    def coalesce(self, pieces: int) -> None:
        """A hint: hand the rest of the body to `aiter_bytes` `pieces` arrivals at a time,
        joined, for a reader that needs no piece the moment it arrives (one wake-up for many
        pieces). Each wait is still bounded from the last piece. A transport may ignore it."""
        ...

    def abort(self, reason: str) -> None: ...

    async def aclose(self) -> None: ...


class UpstreamTransport(Protocol):
    """The proxy's connections to the engines, shared by every proxied request."""

    timeouts: Timeouts

    async def post(
        self,
        target: Target,
        headers: Mapping[str, str],
        body: bytes,
        head_s: float | None = None,
    ) -> UpstreamResponse: ...

    async def aclose(self) -> None: ...
