"""`AppState`: everything one gateway app owns, built in its lifespan and torn down there.

Extensions (shared state, KV events) hang themselves on it from the lifespan:
- `background`: start long-running tasks with `spawn()`; they are cancelled at shutdown;
- `closers`: async callables run at shutdown, last added first;
- `readiness`: named checks reported in `/readyz` detail; a check returning `ok: False`
  with `required: True` makes `/readyz` answer 503;
- `extensions`: a place for their objects, by name.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast, runtime_checkable

import httpx
from starlette.requests import Request

from gateway.h1pool import H1Pool
from gateway.health import HealthChecker
from gateway.metrics import GatewayMetrics
from gateway.prefetch import Prefetcher
from gateway.settings import Settings
from gateway.stats import GatewayStats
from gateway.tokens import PreciseChains
from router.router import Router
from router.types import Decision, RouteRequest

log = logging.getLogger("warmgate.app")

ReadinessCheck = Callable[[], Awaitable[dict[str, Any]]]


@runtime_checkable
class SessionBinder(Protocol):
    """Keeps a player's turns on one instance across gateway replicas (gateway/shared.py,
    registered as `extensions["shared"]`): `lookup()` before routing, `bind()` right after,
    with nothing awaited in between."""

    async def lookup(self, rr: RouteRequest) -> str | None: ...

    def bind(self, rr: RouteRequest, decision: Decision, candidates: Sequence[str]) -> Decision: ...

    async def binding_of(self, key: str) -> dict[str, Any]: ...


@dataclass
class AppState:
    """The gateway's objects, one set per app."""

    settings: Settings
    client: httpx.AsyncClient  # pooled client for upstream calls besides proxying
    upstream: H1Pool  # the proxy's pooled engine connections
    metrics: GatewayMetrics
    stats: GatewayStats
    health: HealthChecker
    router: Router
    prefetcher: Prefetcher
    started_at: float
    precise: PreciseChains | None = None  # routing.mode=precise: token-exact block chains
    background: set[asyncio.Task[Any]] = field(default_factory=set)
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    readiness: dict[str, ReadinessCheck] = field(default_factory=dict)
    extensions: dict[str, Any] = field(default_factory=dict)
    tier_stats: dict[str, dict[str, Any]] = field(default_factory=dict)  # last tierd stats
    # isinstance() on a runtime-checkable protocol costs ~10 µs: checked once per object
    _binder_checked: tuple[object, bool] = field(default=(None, False), repr=False)

    def session_binder(self) -> SessionBinder | None:
        binder = self.extensions.get("shared")
        if binder is None:
            return None
        if self._binder_checked[0] is not binder:
            self._binder_checked = (binder, isinstance(binder, SessionBinder))
        return cast(SessionBinder, binder) if self._binder_checked[1] else None

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

    async def aclose(self) -> None:
        tasks = list(self.background)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for closer in reversed(self.closers):
            try:
                await closer()
            except Exception as exc:  # one failing closer must not skip the others
                log.warning("closer failed: %r", exc)
        await self.prefetcher.aclose()
        await self.upstream.aclose()
        await self.client.aclose()


def app_state(request: Request) -> AppState:
    state = request.app.state.warmgate
    assert isinstance(state, AppState)
    return state
