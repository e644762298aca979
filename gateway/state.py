"""`AppState`: everything one gateway app owns, built in its lifespan and torn down there.

The optional parts (shared state with its session bindings, the KV event consumer) are
built by the lifespan (`gateway.app`), each onto its own field; the state is their `Lifetime`
(gateway/lifetime.py):
- `background`: start long-running tasks with `spawn()`; they are cancelled at shutdown;
- `closers`: async callables run at shutdown, last added first;
- `readiness`: named checks reported in `/readyz` detail; a check returning `ok: False`
  with `required: True` makes `/readyz` answer 503.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
from starlette.requests import Request

from gateway.admin.ui.runtime import UiRuntime
from gateway.config.settings import Settings
from gateway.fleet.engine_load import EngineLoads
from gateway.fleet.health import HealthChecker
from gateway.fleet.kv_events import KvEventConsumer
from gateway.http.access import Access
from gateway.http.limits import Limiter
from gateway.lifetime import Lifetime
from gateway.observe.metrics import GatewayMetrics
from gateway.observe.stats import GatewayStats
from gateway.observe.tracing import Tracing
from gateway.pipeline.decide import RequestPipeline
from gateway.pipeline.prefetch import PrefetchHints
from gateway.pipeline.prefill_gate import PrefillGate
from gateway.pipeline.response_store import ResponseStore
from gateway.pipeline.session_bindings import SessionBindings
from gateway.pipeline.tokens import PreciseChains
from gateway.pipeline.warm import Warmer
from gateway.upstream.inflight import Inflight
from gateway.upstream.transport import UpstreamTransport
from router.router import Router

log = logging.getLogger("warmgate.app")


class FleetStatus(Protocol):
    """What the admin views ask of the runtime fleet (gateway.fleet.runtime.Fleet), which
    itself works over this state."""

    def status_of(self, instance_id: str) -> dict[str, Any]: ...


@dataclass(kw_only=True)
class AppState(Lifetime):
    """The gateway's objects, one set per app (its tasks, closers and readiness checks are
    the `Lifetime` it is)."""

    settings: Settings
    client: httpx.AsyncClient  # pooled client for upstream calls besides proxying
    upstream: UpstreamTransport  # the proxy's engine connections (gateway/upstream/transport.py)
    metrics: GatewayMetrics
    stats: GatewayStats
    health: HealthChecker
    router: Router
    prefetch: PrefetchHints
    started_at: float
    access: Access  # gateway.http.access: who may call what
    inflight: Inflight  # gateway.upstream.inflight: attempts in flight, failed when unhealthy
    limits: Limiter  # gateway.http.limits: rate limits (disabled when none are configured)
    responses: ResponseStore  # gateway.pipeline.response_store: for previous_response_id
    tracing: Tracing  # gateway.observe.tracing: OpenTelemetry spans (off: no-ops)
    precise: PreciseChains | None = None  # routing.mode=precise: token-exact block chains
    pipeline: RequestPipeline | None = None  # gateway.pipeline.decide: built once the parts are
    bindings: SessionBindings | None = None  # gateway.pipeline.shared_state: cross-replica sessions
    kv_events: KvEventConsumer | None = None  # gateway.fleet.kv_events: engines' residency events
    tierd_events: KvEventConsumer | None = None  # gateway.fleet.tierd_events: tierds' events
    fleet: FleetStatus | None = None  # gateway.fleet.runtime.Fleet: runtime fleet changes
    ui: UiRuntime | None = None  # gateway.admin.ui.live fills it: the operator page's history
    engine_load: EngineLoads | None = None  # gateway.fleet.engine_load: engines' own load, veto
    warmer: Warmer | None = None  # gateway.pipeline.warm: POST /v1/warm
    # gateway.pipeline.prefill_gate: background prefills per instance (None: no limit)
    prefill_gate: PrefillGate | None = None
    tier_stats: dict[str, dict[str, Any]] = field(default_factory=dict)  # last tierd stats

    async def aclose(self) -> None:
        await self.end()
        await self.prefetch.aclose()
        await self.upstream.aclose()
        await self.client.aclose()


def app_state(request: Request) -> AppState:
    state = request.app.state.warmgate
    assert isinstance(state, AppState)
    return state
