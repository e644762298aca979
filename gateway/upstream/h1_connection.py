"""One upstream HTTP/1.1 connection of the pool (gateway/upstream/h1pool.py): an asyncio protocol
feeding httptools' C parser, its response streamed as it arrives with back-pressure (past
`HIGH_WATER` unread bytes the socket stops being read, until `LOW_WATER`). A reader that
needs no piece the moment it arrives (an answer assembled for a client that did not stream)
asks for them coalesced (`coalesce()`): woken once for many pieces, not once a token."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import cast

import httptools

from gateway.upstream.transport import (
    Timeouts,
    TransportError,
    UpstreamConnectError,
    UpstreamReadError,
    UpstreamTimeout,
)

HIGH_WATER = 256 * 1024
LOW_WATER = 64 * 1024


class Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: one response at a time, read through a parser."""

    def __init__(self, key: tuple[str, int]) -> None:
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.reusable = False  # set when a response ended cleanly with keep-alive
        self.closed = False
        self._loop = asyncio.get_running_loop()
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[None] | None = None
        self._write_ready: asyncio.Future[None] | None = None
        self._error: TransportError | None = None
        self._headers: list[tuple[str, str]] = []
        self._head_done = False
        self._complete = False
        self._body: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._coalesce = 1  # pieces to gather before the reader is woken
        self._last_body = 0.0  # loop time of the latest piece, while coalescing
        self._timer: asyncio.TimerHandle | None = None

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
            if (
                self._coalesce == 1
                or len(self._body) >= self._coalesce
                or self._complete
                or self._paused
            ):
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
        if self._coalesce > 1:
            self._last_body = self._loop.time()
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

    def _fail(self, error: TransportError) -> None:
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
        self._timer = self._loop.call_later(timeout_s, self._time_out, waiter, timeout_s, what)
        try:
            await waiter
        finally:
            self._timer.cancel()
            self._waiter = None

    def _time_out(self, waiter: asyncio.Future[None], timeout_s: float, what: str) -> None:
        if waiter.done():
            return
        if self._coalesce > 1:  # the reader sleeps through pieces: time runs from the last
            due = self._last_body + timeout_s
            if due > self._loop.time():
                self._timer = self._loop.call_at(due, self._time_out, waiter, timeout_s, what)
                return
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
        self._coalesce = 1
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

    def coalesce(self, pieces: int) -> None:
        """From now on hand the reader the body `pieces` arrivals at a time, joined (the last
        fewer): one wake-up for them, each wait for more still bounded from the last piece."""
        self._coalesce = max(1, pieces)

    async def next_chunk(self, read_s: float) -> bytes:
        """The next piece of the body (pieces, joined, when coalescing); b"" at its end."""
        while (
            len(self._body) < self._coalesce
            and not self._complete
            and not self._paused  # the socket waits for this reader: take what there is
            and self._error is None
        ):
            await self._wait(read_s, "data")
        if not self._body:
            if self._error is not None:
                raise self._error
            return b""
        if self._coalesce == 1:
            chunk = self._body.popleft()
        else:
            chunk = b"".join(self._body)
            self._body.clear()
        self._buffered -= len(chunk)
        if self._paused and self._buffered < LOW_WATER and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return chunk

    def finished(self) -> bool:
        return self._complete and not self._body and self._error is None
