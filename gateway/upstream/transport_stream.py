"""What the library transports (upstream/transport_aiohttp.py, upstream/transport_httpx.py)
share: a response read piece by piece under the seam's rules (gateway/upstream/transport.py): each
wait bounded by its own deadline, `abort()` failing the read in progress, one failure kept
for every later read, and `aclose()` once, reusing the connection only after a whole body."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator

from gateway.upstream.transport import Headers, TransportError, UpstreamTimeout


class StreamedResponse(ABC):
    """One response whose body a library reads; subclasses say how to read and finish."""

    def __init__(self, status_code: int, headers: Headers, read_s: float) -> None:
        self.status_code = status_code
        self.headers = headers
        self._read_s = read_s
        self._loop = asyncio.get_running_loop()
        self._deadline: asyncio.Timeout | None = None
        self._error: TransportError | None = None
        self._aborted: str | None = None
        self._ended = False  # the body was read to its end
        self._closed = False

    @abstractmethod
    async def _read(self) -> bytes:
        """The next piece of the body, b"" at its end; an `TransportError` on failure."""

    @abstractmethod
    async def _finish(self, reuse: bool) -> None:
        """Give the connection back (`reuse`: the body was read whole) or close it."""

    async def _next(self, wait_s: float) -> bytes:
        if self._error is not None:
            raise self._error
        if self._ended:
            return b""
        try:
            async with asyncio.timeout(wait_s) as deadline:
                self._deadline = deadline
                chunk = await self._read()
        except TimeoutError:
            self._error = UpstreamTimeout(self._aborted or f"no data within {wait_s:g} s")
            raise self._error from None
        except TransportError as exc:
            self._error = exc
            raise
        finally:
            self._deadline = None
        if not chunk:
            self._ended = True
        return chunk

    def abort(self, reason: str) -> None:
        """Fail the read in progress (and every later one) with `UpstreamTimeout(reason)`."""
        if self._aborted is None:
            self._aborted = reason
        if self._deadline is not None:
            self._deadline.reschedule(self._loop.time())
        elif self._error is None:
            self._error = UpstreamTimeout(reason)

    async def aiter_bytes(
        self, read_s: float | None = None, first_s: float | None = None
    ) -> AsyncIterator[bytes]:
        wait_s = self._read_s if read_s is None else read_s
        first_wait = wait_s if first_s is None else first_s
        while chunk := await self._next(first_wait):
            first_wait = wait_s
            yield chunk

    def coalesce(self, pieces: int) -> None:
        """Ignored: the library wakes the reader for every piece it reads anyway."""
        del pieces

    async def aread(self) -> bytes:
        return b"".join([chunk async for chunk in self.aiter_bytes()])

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._finish(self._ended and self._error is None)
