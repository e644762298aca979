"""`create_app(settings)`: the gateway as a FastAPI app. Everything it owns (the pooled
upstream client, health checker, router, metrics, prefetch hints, background tasks) is built in
the lifespan, kept on one typed `AppState` (`app.state.warmgate`), and torn down there.

The optional parts attach in the lifespan, named here: shared state and session bindings
(`gateway.shared_state`), the KV event consumer (`gateway.kv_events`), runtime fleet
changes (`gateway.fleet`), rate limits (`gateway.limits`) and the operator page's live data
(`gateway.ui.live`); each registers its tasks, closers and readiness checks on `state`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from fastapi import Depends, FastAPI

from contracts.errors import ConfigurationError
from gateway.admin import build_admin_router
from gateway.asgi_app import GatewayApp
from gateway.engine_check import check_engines
from gateway.engine_load import attach_engine_load
from gateway.errors import install_error_handlers
from gateway.fleet import attach_fleet
from gateway.fleet_api import build_fleet_router
from gateway.h1pool import H1Pool
from gateway.health import HealthChecker
from gateway.kv_capacity import run_discovery
from gateway.kv_events import attach_kv_events
from gateway.kv_resync import attach_health_resync
from gateway.limits import attach_limits
from gateway.metrics import GatewayMetrics
from gateway.middleware import RequestIdMiddleware
from gateway.monitoring import build_monitoring_router
from gateway.openai_api import add_completion_routes, build_openai_router
from gateway.pipeline import RequestPipeline
from gateway.prefetch import PrefetchHints
from gateway.roles import require_admin, require_client
from gateway.routing import build_router
from gateway.schema import install_openapi
from gateway.settings import Settings, load_settings
from gateway.shared_state import attach_shared_state
from gateway.state import AppState
from gateway.stats import GatewayStats
from gateway.tier_stats import run_poller
from gateway.tokens import PreciseChains
from gateway.transport import Timeouts, UpstreamTransport
from gateway.transport_httpx import HttpxTransport
from gateway.ui.live import attach_ui
from gateway.ui.routes import build_ui_admin_router, build_ui_router

log = logging.getLogger("warmgate.app")


def build_upstream(settings: Settings) -> UpstreamTransport:
    """The proxy's connections to the engines, over `upstream.transport` (the same limits
    as `build_client`'s)."""
    t = settings.timeouts
    timeouts = Timeouts(connect_s=t.connect_s, read_s=t.read_s, write_s=t.write_s, pool_s=t.pool_s)
    limits = {"max_connections": t.max_connections, "max_keepalive": t.max_keepalive}
    match settings.upstream.transport:
        case "aiohttp":
            try:  # the `transports` extra
                from gateway.transport_aiohttp import AiohttpTransport
            except ImportError as exc:
                raise ConfigurationError(
                    f"upstream.transport: aiohttp needs aiohttp ({exc}): "
                    "pip install 'warmgate[transports]'"
                ) from None
            return AiohttpTransport(timeouts, **limits)
        case "httpx":
            return HttpxTransport(timeouts, **limits)
        case _:
            return H1Pool(timeouts, **limits)


def build_client(settings: Settings) -> httpx.AsyncClient:
    """The pooled client for upstream calls other than proxying (tierd hints, /tokenize)."""
    t = settings.timeouts
    return httpx.AsyncClient(
        timeout=httpx.Timeout(connect=t.connect_s, read=t.read_s, write=t.write_s, pool=t.pool_s),
        limits=httpx.Limits(
            max_connections=t.max_connections, max_keepalive_connections=t.max_keepalive
        ),
        trust_env=False,  # never route loopback engines through an environment proxy
        follow_redirects=False,
    )


def build_health_client(settings: Settings) -> httpx.AsyncClient:
    """Health checks get their own small pool: a proxy pool full of long streams must
    never make a healthy instance look dead."""
    return httpx.AsyncClient(
        timeout=settings.health.timeout_s,
        limits=httpx.Limits(max_connections=max(4, 2 * len(settings.instances))),
        trust_env=False,
    )


def build_state(settings: Settings) -> AppState:
    metrics = GatewayMetrics()
    client = build_client(settings)
    health_client = build_health_client(settings)
    state = AppState(
        settings=settings,
        client=client,
        upstream=build_upstream(settings),
        metrics=metrics,
        stats=GatewayStats(settings.stats_window_s, settings.stats_window_max),
        health=HealthChecker(settings.instances, settings.health, health_client, metrics),
        router=build_router(settings.routing),
        prefetch=PrefetchHints(
            settings.instances, metrics, client, enabled=settings.tiers.prefetch
        ),
        started_at=time.time(),
    )
    state.closers.append(health_client.aclose)
    metrics.gc_pauses.install()
    state.closers.append(metrics.gc_pauses.remove)
    if settings.routing.mode == "precise":
        state.precise = PreciseChains(settings.routing.precise, client, state.health, state.metrics)
    return state


def build_pipeline(state: AppState) -> RequestPipeline:
    """The request pipeline over the app's parts (after the optional ones attached)."""
    return RequestPipeline(
        state.settings,
        state.health,
        state.router,
        state.metrics,
        state.prefetch,
        precise=state.precise,
        bindings=state.bindings,
    )


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings if settings is not None else load_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = build_state(settings)
        app.state.warmgate = state
        try:
            if settings.routing.mode == "precise":  # hash and cut blocks as the engines do
                checked = await check_engines(settings, state.client)
                routing = settings.routing.model_copy(update={"precise": checked.precise})
                state.settings = settings.model_copy(update={"routing": routing})
                state.precise = PreciseChains(
                    checked.precise, state.client, state.health, state.metrics
                )
            await attach_shared_state(state)
            await attach_kv_events(state)
            await attach_fleet(state)  # after the shared state: it publishes through its sync
            await attach_limits(state)
            await attach_ui(state)
            attach_health_resync(state)
            state.pipeline = build_pipeline(state)  # over the parts just attached
            attach_engine_load(state)
            await state.health.check_all()  # serve with a candidate set from the start
            state.spawn(state.health.run(), "health-checks")
            if state.prefetch.available:
                state.spawn(run_poller(state), "tier-stats")
            if state.router.policy.wants_kv_capacity:
                retry_s = settings.health.interval_s
                state.spawn(run_discovery(state, retry_s=retry_s), "kv-capacity")
            log.info(
                "gateway ready: %d instances (%d healthy), policy %s",
                len(settings.instances),
                len(state.health.healthy_ids()),
                state.router.policy.name,
            )
            yield
        finally:
            await state.aclose()

    app = GatewayApp(
        # the gateway's middleware, outermost first, around every route (fast ones too)
        stack=(RequestIdMiddleware,),
        title="warmgate",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    install_openapi(app, settings.request_limits)
    install_error_handlers(app)
    add_completion_routes(app)
    app.include_router(build_openai_router(), dependencies=[Depends(require_client)])
    app.include_router(build_admin_router(), dependencies=[Depends(require_admin)])
    app.include_router(build_fleet_router(), dependencies=[Depends(require_admin)])
    app.include_router(build_ui_admin_router(), dependencies=[Depends(require_admin)])
    app.include_router(build_ui_router())  # a static shell: its data is admin calls
    app.include_router(build_monitoring_router())
    return app
