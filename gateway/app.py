"""`create_app(settings)`: the gateway as a FastAPI app. Everything it owns (the pooled
upstream client, health checker, router, metrics, prefetch hints, background tasks) is built in
the lifespan, kept on one typed `AppState` (`app.state.warmgate`), and torn down there.

The optional parts attach in the lifespan, named here: shared state and session bindings
(`gateway.pipeline.shared_state`), the KV event consumer (`gateway.fleet.kv_events`), runtime
fleet changes (`gateway.fleet.runtime`), rate limits (`gateway.http.limits`), the operator page's
live data (`gateway.admin.ui.live`); each registers its tasks, closers and readiness checks on
`state`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from fastapi import Depends, FastAPI

from contracts.errors import ConfigurationError
from gateway.admin.api import build_admin_router
from gateway.admin.fleet_api import build_fleet_router
from gateway.admin.ui.live import attach_ui
from gateway.admin.ui.routes import build_ui_admin_router, build_ui_router
from gateway.config.settings import Settings, load_settings
from gateway.epp.start import start_epp
from gateway.errors import install_error_handlers
from gateway.fleet.calibration_probe import start_calibration_probe
from gateway.fleet.engine_check import check_engines
from gateway.fleet.engine_load import start_engine_load
from gateway.fleet.engine_pages import EnginePages
from gateway.fleet.health import HealthChecker
from gateway.fleet.kv_capacity import run_discovery
from gateway.fleet.kv_events import start_kv_events
from gateway.fleet.kv_resync import attach_health_resync
from gateway.fleet.runtime import attach_fleet, tier_stats_poller
from gateway.fleet.tierd_events import engine_tiers, start_tierd_events
from gateway.http.access import Access
from gateway.http.asgi_app import GatewayApp
from gateway.http.limits import build_limiter
from gateway.http.middleware import RequestIdMiddleware
from gateway.http.monitoring import build_monitoring_router
from gateway.http.openai_api import add_completion_routes, build_openai_router
from gateway.http.roles import require_admin, require_client
from gateway.http.schema import install_openapi
from gateway.http.warm_api import add_warm_route
from gateway.observe.metrics import GatewayMetrics
from gateway.observe.stats import GatewayStats
from gateway.observe.tracing import Tracing
from gateway.pipeline.decide import RequestPipeline
from gateway.pipeline.prefetch import PrefetchHints
from gateway.pipeline.prefill_gate import PrefillGate
from gateway.pipeline.response_store import build_response_store
from gateway.pipeline.router_build import build_router
from gateway.pipeline.shared_state import start_shared_state
from gateway.pipeline.tokens import PreciseChains
from gateway.pipeline.warm import Warmer
from gateway.state import AppState
from gateway.upstream.h1pool import H1Pool
from gateway.upstream.inflight import Inflight
from gateway.upstream.transport import Timeouts, UpstreamTransport
from gateway.upstream.transport_httpx import HttpxTransport

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
                from gateway.upstream.transport_aiohttp import AiohttpTransport
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


def build_health_pages(settings: Settings) -> EnginePages:
    """Health checks get their own small pool: a proxy pool full of long streams must
    never make a healthy instance look dead."""
    return EnginePages(
        max_connections=max(4, 2 * len(settings.instances)), timeout_s=settings.health.timeout_s
    )


def build_state(settings: Settings) -> AppState:
    metrics = GatewayMetrics()
    client = build_client(settings)
    upstream = build_upstream(settings)
    health_pages = build_health_pages(settings)
    state = AppState(
        settings=settings,
        client=client,
        upstream=upstream,
        metrics=metrics,
        stats=GatewayStats(settings.stats_window_s, settings.stats_window_max),
        health=HealthChecker(settings.instances, settings.health, health_pages, metrics),
        router=build_router(settings.routing),
        prefetch=PrefetchHints(
            settings.instances, metrics, client, upstream, enabled=settings.tiers.prefetch
        ),
        started_at=time.time(),
        access=Access(settings),
        inflight=Inflight(),
        limits=build_limiter(settings),
        responses=build_response_store(settings),
        tracing=Tracing(),  # the OTEL_* variables
    )
    state.closers.append(state.responses.aclose)
    state.closers.append(state.tracing.aclose)
    state.closers.append(state.limits.aclose)
    state.health.on_unhealthy.append(state.inflight.on_unhealthy)
    state.closers.append(health_pages.aclose)
    metrics.gc_pauses.install()
    state.closers.append(metrics.gc_pauses.remove)
    if settings.priority.background_prefills > 0:
        state.prefill_gate = PrefillGate(
            settings.priority.background_prefills, settings.priority.background_wait_s
        )
    if settings.routing.mode == "precise":
        state.precise = PreciseChains(
            settings.routing.precise,
            settings.fleet_hashing(),
            client,
            state.health,
            state.metrics,
        )
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


def build_warmer(state: AppState) -> Warmer:
    """POST /v1/warm's warmer, over the pipeline and the engines' load."""
    assert state.pipeline is not None
    return Warmer(
        state.settings,
        state.pipeline,
        state.router,
        state.health,
        state.inflight,
        state.prefetch,
        state.client,
        state.metrics.registry,
        state.engine_load,
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
                    checked.precise, checked.hashing, state.client, state.health, state.metrics
                )
            registry = state.metrics.registry
            state.bindings = await start_shared_state(state.settings, state.router, registry, state)
            index = state.router.index
            state.kv_events = await start_kv_events(
                state.settings, index, registry, state, engine_tiers(state.settings)
            )
            if state.kv_events is not None:  # tierds' events join the engines' feed
                state.tierd_events = await start_tierd_events(state.settings, index, state)
            await attach_fleet(state)  # after the shared state: it publishes through its sync
            await attach_ui(state)
            attach_health_resync(state)
            state.pipeline = build_pipeline(state)  # over the parts just attached
            state.engine_load = start_engine_load(state.settings, state.health, registry, state)
            state.warmer = build_warmer(state)
            probe = start_calibration_probe(
                state.settings.calibration,
                state.health,
                state.router.policy,
                state.client,
                state,
                chars_per_token=state.settings.routing.chars_per_token,
            )
            await state.health.check_all()  # serve with a candidate set from the start
            if probe is not None:  # the first probes price the fleet before it serves
                await probe.settled()
            await start_epp(state)  # the Endpoint Picker, when epp.port is set (gateway/epp/)
            state.spawn(state.health.run(), "health-checks")
            if state.prefetch.available:
                state.spawn(tier_stats_poller(state), "tier-stats")
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
    add_warm_route(app)
    app.include_router(build_openai_router(), dependencies=[Depends(require_client)])
    app.include_router(build_admin_router(), dependencies=[Depends(require_admin)])
    app.include_router(build_fleet_router(), dependencies=[Depends(require_admin)])
    app.include_router(build_ui_admin_router(), dependencies=[Depends(require_admin)])
    app.include_router(build_ui_router())  # a static shell: its data is admin calls
    app.include_router(build_monitoring_router())
    return app
