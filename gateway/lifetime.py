"""`Lifetime`: what a component started in the gateway's lifespan needs from the app, and no
more: start background tasks (`spawn`; cancelled at shutdown, a failure logged), register
closers (run at shutdown, last added first) and readiness checks (reported in `/readyz`; one
returning `ok: False` with `required: True` makes it answer 503). `AppState` is one; the
components that start (shared state, KV and tierd event feeds, engine load) take it instead
of the whole state."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("warmgate.app")

ReadinessCheck = Callable[[], Awaitable[dict[str, Any]]]


@dataclass(kw_only=True)
class Lifetime:
    background: set[asyncio.Task[Any]] = field(default_factory=set)
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    readiness: dict[str, ReadinessCheck] = field(default_factory=dict)

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Run `coro` in the background for the app's lifetime; its failure is logged."""
        task = asyncio.create_task(coro, name=name)
        self.background.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self.background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task %s failed: %r", task.get_name(), task.exception())

    async def end(self) -> None:
        """Cancel the background tasks, then run the closers."""
        tasks = list(self.background)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for closer in reversed(self.closers):
            try:
                await closer()
            except Exception as exc:  # one failing closer must not skip the others
                log.warning("closer failed: %r", exc)
