"""Noticing that a client went away, so its upstream request is cancelled.

`race_disconnect()` awaits upstream work while watching the ASGI receive channel for
`http.disconnect` (the body has been read by then, so the next message is the disconnect);
`RelayResponse` is a streaming response that always runs its cleanup, even when the client
left before the first chunk was pulled (a generator that never started never runs its
`finally`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
from fastapi.responses import StreamingResponse
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from contracts.errors import ClientGoneError

T = TypeVar("T")


class ClientDisconnected(ClientGoneError):
    """The client went away while we waited on the upstream."""


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


class Abandoned(ClientGoneError):
    """The work was given up on before it finished (the `abandon` future's reason)."""


async def race_disconnect(
    request: Request, awaitable: Awaitable[T], abandon: asyncio.Future[str] | None = None
) -> T:
    """Await `awaitable`, cancelling it (and raising ClientDisconnected) if the client
    leaves, or (raising Abandoned) when `abandon` resolves first."""
    work: asyncio.Future[T] = asyncio.ensure_future(awaitable)
    watch: asyncio.Future[Any] = asyncio.ensure_future(_wait_disconnect(request))
    both: set[asyncio.Future[Any]] = {work, watch}
    if abandon is not None:
        both.add(abandon)
    try:
        await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not work.done():
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
    if work.cancelled():
        if abandon is not None and abandon.done() and not watch_done(watch):
            raise Abandoned(abandon.result())
        raise ClientDisconnected()
    return work.result()


def watch_done(watch: asyncio.Future[Any]) -> bool:
    return watch.done() and not watch.cancelled()


class RelayResponse(StreamingResponse):
    """A streaming response whose `cleanup` always runs, however the response ends."""

    def __init__(
        self,
        content: AsyncIterator[bytes],
        *,
        cleanup: Callable[[], Awaitable[None]],
        status_code: int,
        headers: dict[str, str],
        media_type: str,
    ) -> None:
        super().__init__(content, status_code=status_code, headers=headers, media_type=media_type)
        self._cleanup = cleanup

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._cleanup()
