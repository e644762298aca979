"""The `httpx` upstream transport (gateway/upstream/transport.py): httpx's AsyncClient (httpcore and
h11 underneath) behind the seam, with the limits and timeouts of `build_client`'s."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

import httpx

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


def _errno(exc: BaseException) -> int | None:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError):
            return seen.errno
        seen = seen.__cause__ or seen.__context__
    return None


def _mapped(exc: httpx.HTTPError, *, started: bool) -> TransportError:
    """httpx's failure as the seam's class; `started`: the response head had arrived."""
    detail = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamTimeout(detail)
    if isinstance(exc, httpx.ConnectError):
        if _errno(exc) in LOCAL_ERRNOS:
            return UpstreamLocalError(f"connect failed here: {exc}")
        return UpstreamConnectError(f"connect failed: {detail}")
    if started:
        return UpstreamReadError(f"the response broke off: {detail}")
    if isinstance(exc, httpx.RemoteProtocolError) and not str(exc).startswith("Server discon"):
        return UpstreamReadError(f"malformed response: {detail}")
    return UpstreamConnectError(f"the connection failed before a response: {detail}")


class HttpxResponse(StreamedResponse):
    def __init__(self, resp: httpx.Response, read_s: float) -> None:
        headers = Headers([(k.decode("latin-1").lower(), v.decode("latin-1"))
                           for k, v in resp.headers.raw])  # fmt: skip
        super().__init__(resp.status_code, headers, read_s)
        self._resp = resp
        self._raw: AsyncIterator[bytes] = resp.aiter_raw()

    async def _read(self) -> bytes:
        try:
            return await anext(self._raw, b"")
        except httpx.HTTPError as exc:
            raise _mapped(exc, started=True) from None

    async def _finish(self, reuse: bool) -> None:
        # httpcore keeps the connection when the body was read to its end, else closes it
        await self._resp.aclose()


class HttpxTransport:
    def __init__(self, timeouts: Timeouts, *, max_connections: int, max_keepalive: int) -> None:
        self.timeouts = timeouts
        t = timeouts
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(connect=t.connect_s, read=None, write=t.write_s, pool=t.pool_s),
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_keepalive
            ),
            trust_env=False,
            follow_redirects=False,
        )
        for name in ("user-agent", "accept"):  # the proxy sends what it means to
            del self._client.headers[name]

    async def post(
        self,
        target: Target,
        headers: Mapping[str, str],
        body: bytes,
        head_s: float | None = None,
    ) -> HttpxResponse:
        check_header_values(headers)
        wait_s = self.timeouts.read_s if head_s is None else head_s
        request = self._client.build_request("POST", target.url, headers=headers, content=body)
        try:
            async with asyncio.timeout(wait_s):
                resp = await self._client.send(request, stream=True)
        except TimeoutError:
            raise UpstreamTimeout(f"no response within {wait_s:g} s") from None
        except httpx.HTTPError as exc:
            raise _mapped(exc, started=False) from None
        return HttpxResponse(resp, self.timeouts.read_s)

    async def aclose(self) -> None:
        await self._client.aclose()
