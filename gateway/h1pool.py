"""The proxy's upstream HTTP/1.1 client: a keep-alive connection pool on asyncio protocols
with httptools' C parser.

httpx (with httpcore and h11, all pure Python) took half of the gateway's CPU per proxied
request; this does the one thing the proxy needs (a POST to a loopback or LAN engine, the
response streamed back) in one write and one parser callback per read. Other upstream calls
(health checks, tierd hints, /tokenize) keep httpx.

- Connections are kept per (host, port), reused last-in first-out; one that saw EOF, an
  error, `Connection: close`, or a response not read to its end is closed, not reused. A
  reused connection that the engine closes before any byte of a response is retried once
  on a fresh connection (the engine closed it idle, as the request went out).
- Limits and timeouts mirror httpx's: at most `max_connections` open (waiting for one is
  bounded by `pool_s`), at most `max_keepalive` idle; `connect_s` to connect, `read_s` for
  each wait on the engine's bytes, `write_s` for a body the socket could not take at once.
- Reading applies back-pressure: past `HIGH_WATER` unread bytes the socket stops being read.
- Errors are `UpstreamError`s: `UpstreamTimeout`, `UpstreamConnectError` (could not connect,
  or the connection died before a response started), `UpstreamReadError` (a malformed
  response, or one cut short).
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
from collections import deque
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools

from contracts.errors import UpstreamError as WarmgateUpstreamError

HIGH_WATER = 256 * 1024
LOW_WATER = 64 * 1024


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


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: one response at a time, read through a parser."""

    def __init__(self, pool: H1Pool, key: tuple[str, int]) -> None:
        self.pool = pool
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.reusable = False  # set when a response ended cleanly with keep-alive
        self.closed = False
        self._loop = asyncio.get_running_loop()
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[None] | None = None
        self._write_ready: asyncio.Future[None] | None = None
        self._error: UpstreamError | None = None
        self._headers: list[tuple[str, str]] = []
        self._head_done = False
        self._complete = False
        self._body: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False

    # --- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(UpstreamReadError("unexpected protocol upgrade"))
        except httptools.HttpParserError as exc:
            self._fail(UpstreamReadError(f"malformed response: {exc}"))
        else:
            self._wake()

    def eof_received(self) -> bool | None:
        self._lost(None)
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost(exc)
        if self._write_ready is not None and not self._write_ready.done():
            self._write_ready.set_result(None)

    def pause_writing(self) -> None:
        self._write_ready = self._loop.create_future()

    def resume_writing(self) -> None:
        if self._write_ready is not None and not self._write_ready.done():
            self._write_ready.set_result(None)
        self._write_ready = None

    # --- httptools callbacks ---------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.decode("latin-1").lower(), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        self._head_done = True

    def on_body(self, body: bytes) -> None:
        self._body.append(body)
        self._buffered += len(body)
        if self._buffered > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        self._complete = True
        self.reusable = self._parser.should_keep_alive()

    # --- state -----------------------------------------------------------------------------
    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _fail(self, error: UpstreamError) -> None:
        if self._error is None:
            self._error = error
        self.reusable = False
        self.close()
        self._wake()

    def _lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.reusable = False
        if self._complete or self._error is not None:
            self._wake()
            return
        if self._head_done and not self._framed():
            self._complete = True  # a body delimited by the end of the connection
        elif not self._head_done:
            detail = f": {exc}" if exc else ""
            self._error = UpstreamConnectError(f"the server closed the connection{detail}")
        else:
            self._error = UpstreamReadError("the server closed the connection mid-response")
        self._wake()

    def _framed(self) -> bool:
        return any(n in ("content-length", "transfer-encoding") for n, _ in self._headers)

    async def _wait(self, timeout_s: float, what: str) -> None:
        """Until the parser has something new, the connection failed or `timeout_s` passed
        (a bare timer: asyncio.timeout() costs several times more per wait)."""
        waiter = self._waiter = self._loop.create_future()
        timer = self._loop.call_later(timeout_s, self._time_out, waiter, timeout_s, what)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def _time_out(self, waiter: asyncio.Future[None], timeout_s: float, what: str) -> None:
        if not waiter.done():
            self._fail(UpstreamTimeout(f"no {what} within {timeout_s:g} s"))

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # --- one exchange ----------------------------------------------------------------------
    async def send(self, head: bytes, body: bytes, timeouts: Timeouts) -> None:
        assert self.transport is not None
        self._parser = httptools.HttpResponseParser(self)
        self._headers, self._head_done, self._complete = [], False, False
        self.reusable = False
        self.transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            self.transport.write(body)  # no copy of a big body into the head
        if self._write_ready is not None:
            try:
                async with asyncio.timeout(timeouts.write_s):
                    await self._write_ready
            except TimeoutError:
                self._fail(UpstreamTimeout(f"the body was not taken within {timeouts.write_s:g} s"))
        while not self._head_done and self._error is None:
            await self._wait(timeouts.read_s, "response")
        if self._error is not None:
            raise self._error

    def status(self) -> int:
        return self._parser.get_status_code()

    def headers(self) -> list[tuple[str, str]]:
        return self._headers

    async def next_chunk(self, read_s: float) -> bytes:
        """The next piece of the body; b"" at its end."""
        while not self._body:
            if self._error is not None:
                raise self._error
            if self._complete:
                return b""
            await self._wait(read_s, "data")
        chunk = self._body.popleft()
        self._buffered -= len(chunk)
        if self._paused and self._buffered < LOW_WATER and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return chunk

    def finished(self) -> bool:
        return self._complete and not self._body and self._error is None


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


class UpstreamResponse:
    """A response whose body is read as it arrives; `aclose()` always (idempotent)."""

    def __init__(self, pool: H1Pool, conn: _Connection) -> None:
        self._pool = pool
        self._conn: _Connection | None = conn
        self.status_code = conn.status()
        self.headers = Headers(conn.headers())

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
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._idle_count = 0
        self._open = 0
        self._slot_waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False
        self._targets: dict[str, Target] = {}

    def target(self, url: str) -> Target:
        """`url` parsed (once: instance URLs and paths are few and fixed)."""
        target = self._targets.get(url)
        if target is None:
            target = self._targets[url] = Target.parse(url)
        return target

    async def post(
        self,
        target: Target,
        headers: Mapping[str, str],
        body: bytes,
        head_s: float | None = None,
    ) -> UpstreamResponse:
        """Send a POST and return once the response head has arrived (within `head_s`,
        default the pool's `read_s`)."""
        timeouts = (
            self.timeouts if head_s is None else dataclasses.replace(self.timeouts, read_s=head_s)
        )
        lines = [b"POST ", target.path, b" HTTP/1.1\r\nhost: ", target.host_header, b"\r\n"]
        for name, value in headers.items():
            encoded = value.encode("latin-1")
            if b"\r" in encoded or b"\n" in encoded:
                raise ValueError(f"header {name!r} holds a line break")
            lines += [name.encode("latin-1"), b": ", encoded, b"\r\n"]
        lines += [b"content-length: ", str(len(body)).encode(), b"\r\n\r\n"]
        head = b"".join(lines)
        conn, reused = await self._acquire(target)
        while True:
            try:
                await conn.send(head, body, timeouts)
                return UpstreamResponse(self, conn)
            except BaseException as exc:
                conn.reusable = False
                self.release(conn)
                # An idle keep-alive connection the engine closed as we sent (uvicorn closes
                # idle ones after 5 s) never saw the request: one fresh connection retries
                # it rather than failing the instance over.
                if not (reused and isinstance(exc, UpstreamConnectError)):
                    raise
            conn, reused = await self._acquire(target, fresh=True)

    async def _acquire(self, target: Target, *, fresh: bool = False) -> tuple[_Connection, bool]:
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
                    lambda: _Connection(self, key), target.host, target.port
                )
        except TimeoutError:
            self._forget(None)
            raise UpstreamTimeout(
                f"connect timed out after {self.timeouts.connect_s:g} s"
            ) from None
        except OSError as exc:
            self._forget(None)
            if exc.errno in _LOCAL_ERRNOS:
                raise UpstreamLocalError(f"connect failed here: {exc}") from None
            raise UpstreamConnectError(f"connect failed: {exc}") from None
        except BaseException:
            self._forget(None)
            raise
        return conn, False

    def release(self, conn: _Connection) -> None:
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

    def _forget(self, conn: _Connection | None) -> None:
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
