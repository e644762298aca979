"""Noticing that a client went away, so its upstream request is cancelled.

`ClientWatch` is one per request: a single task reads the ASGI receive channel (the body
has been read by then, so its next message is `http.disconnect`) for the whole request.
While an await is guarded (`guard()`), the client leaving (or the `abandon` future
resolving: a hung engine given up on) cancels that await *in place*, in the request's own
task; the caller gets ClientDisconnected or Abandoned. No task per await: the earlier
`race_disconnect()` ran the work and a watcher as two new tasks for every await (two or
three per request, plus the anyio task group Starlette opens for each streamed response),
and tasks are a good share of a request's CPU here (docs/BENCHMARKS.md, issue 21 item 3).

Why cancelling in place is safe: the watcher runs only while the guarded task is
suspended, and the guarded task is suspended inside the guarded await until it leaves it
without another suspension; so the cancel is delivered inside that await, never after.

`RelayResponse` is a streaming response that streams under the request's watch and always
runs its cleanup, even when the client left before the first chunk was pulled (a
generator that never started never runs its `finally`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import anyio
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from contracts.errors import ClientGoneError

T = TypeVar("T")

_GONE = object()  # why a guarded await was cancelled: the client left


class ClientDisconnected(ClientGoneError):
    """The client went away while we waited on the upstream."""


class Abandoned(ClientGoneError):
    """The work was given up on before it finished (the `abandon` future's reason)."""


class ClientWatch:
    """The client's side of one request: gone or not, and the await to cancel when it goes."""

    __slots__ = ("_abandon", "_armed", "_receive", "_watcher", "_why", "gone")

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._watcher: asyncio.Task[None] | None = None
        self._armed: asyncio.Task[Any] | None = None  # the task inside a guarded await
        self._why: object = None  # why we cancelled it: _GONE or the abandon reason
        self._abandon: asyncio.Future[str] | None = None
        self.gone = False

    async def _watch(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        self.gone = True
        self._interrupt(_GONE)

    def _interrupt(self, why: object) -> None:
        task = self._armed
        if task is not None and self._why is None:
            self._why = why
            task.cancel()

    def _abandoned(self, future: asyncio.Future[str]) -> None:
        if future is self._abandon and not future.cancelled():
            self._interrupt(future.result())

    def stop(self) -> None:
        """The request is over: stop reading the receive channel."""
        if self._watcher is not None and not self._watcher.done():
            self._watcher.cancel()

    async def guard(
        self, awaitable: Coroutine[Any, Any, T], abandon: asyncio.Future[str] | None = None
    ) -> T:
        """Await `awaitable`, cancelling it (and raising ClientDisconnected) if the client
        leaves, or (raising Abandoned) when `abandon` resolves first."""
        if self.gone or (abandon is not None and abandon.done()):
            awaitable.close()  # never started
            if self.gone:
                raise ClientDisconnected()
            assert abandon is not None
            raise Abandoned(abandon.result())
        if self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self._watch())
        task = asyncio.current_task()
        assert task is not None and self._armed is None, "one guarded await at a time"
        self._armed, self._why, self._abandon = task, None, abandon
        if abandon is not None:
            abandon.add_done_callback(self._abandoned)
        try:
            result = await awaitable
        except asyncio.CancelledError:
            self._disarm(abandon)
            why = self._why
            if why is None:
                raise  # cancelled from outside: not ours to turn into an error
            task.uncancel()
            if why is _GONE:
                raise ClientDisconnected() from None
            raise Abandoned(str(why)) from None
        except BaseException:
            self._disarm(abandon)
            raise
        self._disarm(abandon)
        if self._why is not None:
            task.uncancel()  # ours, and the work swallowed it: it finished anyway
        return result

    def _disarm(self, abandon: asyncio.Future[str] | None) -> None:
        self._armed, self._abandon = None, None
        if abandon is not None:
            abandon.remove_done_callback(self._abandoned)


class RelayResponse(StreamingResponse):
    """A streaming response that stops when the request's `watch` sees the client leave,
    and whose `cleanup` always runs, however the response ends."""

    def __init__(
        self,
        content: AsyncIterator[bytes],
        *,
        watch: ClientWatch,
        cleanup: Callable[[], Awaitable[None]],
        status_code: int,
        headers: dict[str, str],
        media_type: str,
    ) -> None:
        super().__init__(content, status_code=status_code, headers=headers, media_type=media_type)
        self._watch = watch
        self._cleanup = cleanup

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._watch.guard(self.stream_response(send))
        except ClientDisconnected:
            pass  # as Starlette's own: the client left, the response just ends
        finally:
            with anyio.CancelScope(shield=True):
                await self._cleanup()
