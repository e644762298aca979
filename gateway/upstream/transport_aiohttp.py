"""The `aiohttp` upstream transport (gateway/upstream/transport.py): aiohttp's client session, its
C HTTP parser and connection pool, behind the seam. Needs the `transports` extra.

Limits: `max_connections` open at once (aiohttp's connector limit, any host); aiohttp has
no cap on idle connections, so `max_keepalive` only says whether to keep any (0: close each
after use). `pool_s` bounds the wait for a connection, new or pooled (aiohttp's `connect`
timeout), `connect_s` the TCP connect (`sock_connect`); aiohttp has no write timeout.

One difference the gateway's tests see: when a connection dies, aiohttp's body reader
raises at once and drops the bytes that had arrived with the cut (its `StreamReader` raises
before its buffer), so an engine that sends a first event and dies in the same breath is a
failure before the first byte here (failed over), a relayed event then an error event with
`h1pool` and `httpx`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import aiohttp

from gateway.upstream.transport import (
    LOCAL_ERRNOS,
    Headers,
    Target,
    Timeouts,
    TransportError,
    UpstreamConnectError,
    UpstreamLocalError,
    UpstreamReadError,
    UpstreamTimeout,
    check_header_values,
)
from gateway.upstream.transport_stream import StreamedResponse

# aiohttp adds these unless told not to; the proxy sends what it means to (gateway/http/proxy.py)
_SKIP_AUTO = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")


def _mapped(exc: Exception, *, started: bool) -> TransportError:
    """aiohttp's failure as the seam's class; `started`: the response head had arrived."""
    detail = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, TimeoutError):
        return UpstreamTimeout(detail)
    if isinstance(exc, aiohttp.ClientConnectorError):
        if exc.os_error.errno in LOCAL_ERRNOS:
            return UpstreamLocalError(f"connect failed here: {exc}")
        return UpstreamConnectError(f"connect failed: {exc}")
    if isinstance(exc, aiohttp.ClientResponseError | aiohttp.ClientPayloadError):
        return UpstreamReadError(detail)  # a malformed or cut-short response
    if started:
        return UpstreamReadError(f"the connection failed mid-response: {detail}")
    return UpstreamConnectError(f"the connection failed before a response: {detail}")


class AiohttpResponse(StreamedResponse):
    def __init__(self, resp: aiohttp.ClientResponse, read_s: float) -> None:
        headers = Headers([(k.decode("latin-1").lower(), v.decode("latin-1"))
                           for k, v in resp.raw_headers])  # fmt: skip
        super().__init__(resp.status, headers, read_s)
        self._resp = resp

    async def _read(self) -> bytes:
        try:
            return await self._resp.content.readany()
        except aiohttp.ClientError as exc:
            raise _mapped(exc, started=True) from None

    async def _finish(self, reuse: bool) -> None:
        if reuse:
            self._resp.release()
        else:
            self._resp.close()  # an unread rest would be taken for the next response


class AiohttpTransport:
    def __init__(self, timeouts: Timeouts, *, max_connections: int, max_keepalive: int) -> None:
        self.timeouts = timeouts
        self._max_connections = max_connections
        self._keep_alive = max_keepalive > 0
        self._session: aiohttp.ClientSession | None = None  # made in the running loop

    def _open(self) -> aiohttp.ClientSession:
        t = self.timeouts
        connector = aiohttp.TCPConnector(
            limit=self._max_connections, limit_per_host=0, force_close=not self._keep_alive
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(
                total=None, connect=t.pool_s, sock_connect=t.connect_s, sock_read=None
            ),
            skip_auto_headers=_SKIP_AUTO,
            auto_decompress=False,
            trust_env=False,
        )
        return self._session

    async def post(
        self,
        target: Target,
        headers: Mapping[str, str],
        body: bytes,
        head_s: float | None = None,
    ) -> AiohttpResponse:
        check_header_values(headers)
        session = self._session or self._open()
        wait_s = self.timeouts.read_s if head_s is None else head_s
        try:
            async with asyncio.timeout(wait_s):
                resp = await session.post(
                    target.url, data=body, headers=dict(headers), allow_redirects=False
                )
        except TimeoutError as exc:
            if isinstance(exc, aiohttp.ServerTimeoutError):  # aiohttp's own: pool or connect
                raise UpstreamTimeout(f"{type(exc).__name__}: {exc}") from None
            raise UpstreamTimeout(f"no response within {wait_s:g} s") from None
        except aiohttp.ClientError as exc:
            raise _mapped(exc, started=False) from None
        except OSError as exc:
            raise _mapped(aiohttp.ClientOSError(exc.errno, str(exc)), started=False) from None
        return AiohttpResponse(resp, self.timeouts.read_s)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
