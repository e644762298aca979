"""The upstream HTTP/1.1 pool's types (gateway/h1pool.py): its errors, timeouts, a parsed
target and the response headers."""

from __future__ import annotations

import errno
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from contracts.errors import UpstreamError as WarmgateUpstreamError


class UpstreamError(WarmgateUpstreamError):
    """The upstream request failed (the HTTP/1.1 pool's own failures)."""


class UpstreamTimeout(UpstreamError):
    pass


class UpstreamConnectError(UpstreamError):
    pass


class UpstreamLocalError(UpstreamError):
    """The gateway itself ran out (file descriptors, buffers): no fault of the engine's."""


_LOCAL_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


class UpstreamReadError(UpstreamError):
    pass


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

    @classmethod
    def parse(cls, url: str) -> Target:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"only http:// URLs are proxied, not {url!r}")
        port = parts.port or 80
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        return cls(parts.hostname, port, parts.netloc.encode("idna"), path.encode("ascii"))


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
