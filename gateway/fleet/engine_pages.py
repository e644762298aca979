"""GETs of the engines' small pages (`/health`, `/metrics`, the model list) for the background
loops that watch them (gateway/fleet/health.py, gateway/fleet/engine_load.py).

They go over a keep-alive pool of their own on the proxy's HTTP/1.1 client
(gateway/upstream/h1pool.py), not httpx: an idle gateway in front of two vLLM engines spent
about half of its CPU in httpx's machinery for these GETs, more than the pages' parsing. A
pool apart from the proxy's, so that streams filling the proxy's pool never make a healthy
engine look dead.

`EnginePages.get(url, timeout_s)` bounds the whole exchange (connect, head, body) by
`timeout_s` and answers a `Page` (status and body), or raises `PageUnavailable` whose message
says why, in the words the operator sees (`UpstreamConnectError: connect failed: ...`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from contracts.errors import UpstreamError
from gateway.json_codec import decode
from gateway.upstream.h1pool import H1Pool
from gateway.upstream.transport import Timeouts, TransportError, target_of


class PageUnavailable(UpstreamError):
    """The engine gave no page: it could not be reached, did not answer in time, or cut
    the answer short."""


@dataclass(frozen=True, slots=True)
class Page:
    status_code: int
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> object:
        """The body as JSON; ValueError when it is not."""
        return decode(self.body)[0]


class EnginePages:
    """A keep-alive pool for the engines' pages; `aclose()` at shutdown."""

    def __init__(self, *, max_connections: int, timeout_s: float) -> None:
        t = Timeouts(connect_s=timeout_s, read_s=timeout_s, write_s=timeout_s, pool_s=timeout_s)
        self._pool = H1Pool(t, max_connections=max_connections, max_keepalive=max_connections)

    async def get(self, url: str, timeout_s: float) -> Page:
        try:
            async with asyncio.timeout(timeout_s):
                resp = await self._pool.get(target_of(url), head_s=timeout_s)
                try:
                    body = await resp.aread()
                finally:
                    await resp.aclose()  # gives the connection back, or closes it
        except TimeoutError:
            raise PageUnavailable(f"no answer within {timeout_s:g} s") from None
        except (TransportError, ValueError) as exc:  # ValueError: a URL it cannot GET
            raise PageUnavailable(f"{type(exc).__name__}: {exc}".rstrip(": ")) from None
        return Page(resp.status_code, body)

    async def aclose(self) -> None:
        await self._pool.aclose()
