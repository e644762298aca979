"""The proxy's upstream HTTP/1.1 client: a keep-alive connection pool on asyncio protocols
with httptools' C parser (the `h1pool` transport of gateway/upstream/transport.py, the default).

httpx (with httpcore and h11, all pure Python) took half of the gateway's CPU per proxied
request; this does the one thing the proxy needs (a POST to a loopback or LAN engine, the
response streamed back) in one write and one parser callback per read. The background GETs of
engines' small pages (health, metrics: gateway/fleet/engine_pages.py) use a pool of their
own; other upstream calls (tierd hints, /tokenize) keep httpx.

- Connections are kept per (host, port), reused last-in first-out; one that saw EOF, an
  error, `Connection: close`, or a response not read to its end is closed, not reused. A
  reused connection that the engine closes before any byte of a response is retried once
  on a fresh connection (the engine closed it idle, as the request went out).
- Limits and timeouts mirror httpx's: at most `max_connections` open (waiting for one is
  bounded by `pool_s`), at most `max_keepalive` idle; `connect_s` to connect, `read_s` for
  each wait on the engine's bytes, `write_s` for a body the socket could not take at once.
- Reading applies back-pressure: past `HIGH_WATER` unread bytes the socket stops being read.
- Errors are `TransportError`s: `UpstreamTimeout`, `UpstreamConnectError` (could not connect,
  or the connection died before a response started), `UpstreamReadError` (a malformed
  response, or one cut short).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import deque
from collections.abc import AsyncIterator, Mapping

from gateway.upstream.h1_connection import Connection
from gateway.upstream.transport import (
    LOCAL_ERRNOS,
    HeaderLineBreakError,
    Headers,
    Target,
    Timeouts,
    UpstreamConnectError,
    UpstreamLocalError,
    UpstreamTimeout,
)


class H1Response:
    """A response whose body is read as it arrives; `aclose()` always (idempotent)."""

    def __init__(self, pool: H1Pool, conn: Connection) -> None:
        self._pool = pool
        self._conn: Connection | None = conn
        self.status_code = conn.status()
        self.headers = Headers(conn.headers())

    def coalesce(self, pieces: int) -> None:
        if self._conn is not None:
            self._conn.coalesce(pieces)

    def abort(self, reason: str) -> None:
        """Fail the read in progress (and every later one) with `UpstreamTimeout(reason)`."""
        if self._conn is not None:
            self._conn._fail(UpstreamTimeout(reason))

    async def aiter_bytes(
        self, read_s: float | None = None, first_s: float | None = None
    ) -> AsyncIterator[bytes]:
        """The body as it arrives; `read_s` (default the pool's) bounds each wait, `first_s`
        (default `read_s`) the wait for the first piece."""
        wait_s = self._pool.timeouts.read_s if read_s is None else read_s
        first_wait = wait_s if first_s is None else first_s
        try:
            while self._conn is not None:
                chunk = await self._conn.next_chunk(first_wait)
                first_wait = wait_s
                if not chunk:
                    break
                yield chunk
        finally:
            if self._conn is not None and self._conn.finished():
                self._release()

    async def aread(self) -> bytes:
        return b"".join([chunk async for chunk in self.aiter_bytes()])

    def _release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._pool.release(conn)

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            if not conn.finished():
                conn.reusable = False  # an unread rest would be taken for the next response
            self._pool.release(conn)


class H1Pool:
    """Keep-alive connections to upstream engines, shared by every proxied request."""

    def __init__(self, timeouts: Timeouts, *, max_connections: int, max_keepalive: int) -> None:
        self.timeouts = timeouts
        self._max_connections = max_connections
        self._max_keepalive = max_keepalive
        self._idle: dict[tuple[str, int], list[Connection]] = {}
        self._idle_count = 0
        self._open = 0
        self._slot_waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False

    async def post(
        self,
        target: Target,
        headers: Mapping[str, str],
        body: bytes,
        head_s: float | None = None,
    ) -> H1Response:
        """Send a POST and return once the response head has arrived (within `head_s`,
        default the pool's `read_s`)."""
        return await self._request(b"POST", target, headers, body, head_s)

    async def get(self, target: Target, head_s: float | None = None) -> H1Response:
        """Send a GET and return once the response head has arrived (as `post`)."""
        return await self._request(b"GET", target, {}, None, head_s)

    async def _request(
        self,
        method: bytes,
        target: Target,
        headers: Mapping[str, str],
        body: bytes | None,
        head_s: float | None,
    ) -> H1Response:
        timeouts = (
            self.timeouts if head_s is None else dataclasses.replace(self.timeouts, read_s=head_s)
        )
        lines = [method, b" ", target.path, b" HTTP/1.1\r\nhost: ", target.host_header, b"\r\n"]
        for name, value in headers.items():
            encoded = value.encode("latin-1")
            if b"\r" in encoded or b"\n" in encoded:
                raise HeaderLineBreakError(f"header {name!r} holds a line break")
            lines += [name.encode("latin-1"), b": ", encoded, b"\r\n"]
        if body is not None:
            lines += [b"content-length: ", str(len(body)).encode(), b"\r\n"]
        lines.append(b"\r\n")
        body = body or b""
        head = b"".join(lines)
        conn, reused = await self._acquire(target)
        while True:
            try:
                await conn.send(head, body, timeouts)
                return H1Response(self, conn)
            except BaseException as exc:
                conn.reusable = False
                self.release(conn)
                # An idle keep-alive connection the engine closed as we sent (uvicorn closes
                # idle ones after 5 s) never saw the request: one fresh connection retries
                # it rather than failing the instance over.
                if not (reused and isinstance(exc, UpstreamConnectError)):
                    raise
            conn, reused = await self._acquire(target, fresh=True)

    async def _acquire(self, target: Target, *, fresh: bool = False) -> tuple[Connection, bool]:
        """A connection to `target` and whether it was reused from the idle list."""
        key = (target.host, target.port)
        idle = None if fresh else self._idle.get(key)
        while idle:
            conn = idle.pop()
            self._idle_count -= 1
            if not conn.closed:
                return conn, True
            self._forget(conn)
        loop = asyncio.get_running_loop()
        if self._open >= self._max_connections:
            slot: asyncio.Future[None] = loop.create_future()
            self._slot_waiters.append(slot)
            try:
                async with asyncio.timeout(self.timeouts.pool_s):
                    await slot
            except TimeoutError:
                raise UpstreamTimeout(
                    f"no free connection within {self.timeouts.pool_s:g} s"
                ) from None
            finally:
                if not slot.done():
                    self._slot_waiters.remove(slot)
            return await self._acquire(target, fresh=fresh)  # an idle one may be free now
        self._open += 1
        try:
            async with asyncio.timeout(self.timeouts.connect_s):
                _, conn = await loop.create_connection(
                    lambda: Connection(key), target.host, target.port
                )
        except TimeoutError:
            self._forget(None)
            raise UpstreamTimeout(
                f"connect timed out after {self.timeouts.connect_s:g} s"
            ) from None
        except OSError as exc:
            self._forget(None)
            if exc.errno in LOCAL_ERRNOS:
                raise UpstreamLocalError(f"connect failed here: {exc}") from None
            raise UpstreamConnectError(f"connect failed: {exc}") from None
        except BaseException:
            self._forget(None)
            raise
        return conn, False

    def release(self, conn: Connection) -> None:
        """Back to the idle list when it can serve another request, else closed."""
        if (
            conn.reusable
            and not conn.closed
            and not self._closed
            and self._idle_count < self._max_keepalive
        ):
            self._idle.setdefault(conn.key, []).append(conn)
            self._idle_count += 1
            while self._slot_waiters:  # a request waiting for a slot can take this one
                slot = self._slot_waiters.popleft()
                if not slot.done():
                    slot.set_result(None)
                    break
            return
        conn.close()
        self._forget(conn)

    def _forget(self, conn: Connection | None) -> None:
        """One connection fewer is open: wake a request waiting for a slot."""
        self._open -= 1
        while self._slot_waiters:
            slot = self._slot_waiters.popleft()
            if not slot.done():
                slot.set_result(None)
                return

    async def aclose(self) -> None:
        self._closed = True
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()
        self._idle_count = 0
