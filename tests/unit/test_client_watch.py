"""gateway.upstream.disconnect.ClientWatch: one watch per request, the guarded await
cancelled in place (the real server's side is tests/integration/test_gateway_cancel.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.upstream.disconnect import Abandoned, ClientDisconnected, ClientWatch


class Channel:
    """An ASGI receive channel: the test says when the client leaves."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.reads = 0

    async def __call__(self) -> dict[str, Any]:
        self.reads += 1
        return await self.queue.get()

    def leave(self) -> None:
        self.queue.put_nowait({"type": "http.disconnect"})


async def _slow(cleaned: list[str], seconds: float = 5.0) -> str:
    try:
        await asyncio.sleep(seconds)
        return "done"
    finally:
        cleaned.append("cleaned")


async def test_result_passes_through_and_one_watch_serves_many_awaits() -> None:
    channel = Channel()
    watch = ClientWatch(channel)
    cleaned: list[str] = []
    assert await watch.guard(_slow(cleaned, 0)) == "done"
    assert await watch.guard(_slow(cleaned, 0)) == "done"
    await asyncio.sleep(0)
    assert channel.reads == 1  # one reader for the whole request
    watch.stop()


async def test_disconnect_cancels_the_guarded_await_in_place() -> None:
    channel = Channel()
    watch = ClientWatch(channel)
    cleaned: list[str] = []
    asyncio.get_running_loop().call_later(0.01, channel.leave)
    with pytest.raises(ClientDisconnected):
        await watch.guard(_slow(cleaned))
    assert cleaned == ["cleaned"]  # the work ran its own cleanup
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0  # nothing left to hit a later await
    await asyncio.sleep(0)  # and indeed: no stray cancellation
    with pytest.raises(ClientDisconnected):  # gone stays gone; the work is never started
        await watch.guard(_slow(cleaned))
    assert cleaned == ["cleaned"]


async def test_abandon_gives_up_with_its_reason() -> None:
    watch = ClientWatch(Channel())
    abandon: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_later(0.01, abandon.set_result, "e1 marked unhealthy")
    with pytest.raises(Abandoned, match="e1 marked unhealthy"):
        await watch.guard(_slow([]), abandon)
    assert not watch.gone
    assert await watch.guard(_slow([], 0)) == "done"  # the request goes on (a failover)
    watch.stop()


async def test_a_cancel_from_outside_stays_a_cancel() -> None:
    watch = ClientWatch(Channel())
    task = asyncio.ensure_future(watch.guard(_slow([])))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    watch.stop()


async def test_leaving_between_awaits_is_noticed_at_the_next() -> None:
    channel = Channel()
    watch = ClientWatch(channel)
    assert await watch.guard(_slow([], 0)) == "done"
    channel.leave()
    await asyncio.sleep(0.01)
    assert watch.gone
    with pytest.raises(ClientDisconnected):
        await watch.guard(_slow([]))
