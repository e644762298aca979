"""uvicorn's server, woken once a second when idle instead of ten times.

uvicorn's `Server.main_loop` sleeps 0.1 s between ticks, to notice `should_exit` (set by its
signal handler) and to refresh the Date header every tenth tick. An idle gateway pays that
wake-up ten times a second: bench.proxy_floor, uvicorn and nothing else, burned 1.8 ms of
CPU a second in front of two vLLM engines (docs/BENCHMARKS.md, the idle gateway). Here the
loop waits on an event the exit handler sets, for at most a second: an exit is noticed at
once, and the Date header is refreshed each second as before.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import FrameType

import uvicorn

TICK_S = 1.0  # uvicorn refreshes the Date header once a second: a tick no longer than that
_TICKS_A_SECOND = 10  # uvicorn's on_tick counts tenths: counter % 10 == 0 is a new second
_COUNTER_WRAP = 864_000  # as uvicorn wraps it


class QuietServer(uvicorn.Server):
    """`uvicorn.Server` whose main loop sleeps until an exit or the next second."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._exit: asyncio.Event | None = None

    async def main_loop(self) -> None:
        self._loop, self._exit = asyncio.get_running_loop(), asyncio.Event()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + _TICKS_A_SECOND) % _COUNTER_WRAP
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(TICK_S):
                    await self._exit.wait()
            should_exit = await self.on_tick(counter)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        loop, event = self._loop, self._exit
        if loop is not None and event is not None and not loop.is_closed():
            loop.call_soon_threadsafe(event.set)  # a signal handler: wake the loop safely
