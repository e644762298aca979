"""Shared state inside the gateway: starts `router.state.sync.StateSync` (in-flight counts,
the residency event stream, snapshots) for the app, exports its health as metrics and in
`/readyz`, and hands the session bindings (`gateway.pipeline.session_bindings`) their store.

If Redis goes away, routing goes on from local state: `warmgate_state_redis_up` drops to
0, `/readyz` shows it under `shared_state` (not required: serving continues), and the sync
loops reconnect with backoff, republish in-flight counts and read the stream on.
"""

from __future__ import annotations

import os
import socket
import uuid
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge

from gateway.config.settings import StateSettings
from gateway.pipeline.session_bindings import SessionBindings
from router.state.base import SharedState, StateUnavailableError
from router.state.memory import MemoryState
from router.state.redis import RedisState
from router.state.sync import StateSync, SyncConfig, SyncObservers

if TYPE_CHECKING:
    from gateway.state import AppState


class StateMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.redis_up = Gauge(
            "warmgate_state_redis_up",
            "1 while the shared state store answers (always 1 for the memory backend).",
            registry=registry,
        )
        self.errors = Counter(
            "warmgate_state_errors",
            "Shared-state calls that failed, by operation.",
            ["op"],
            registry=registry,
        )
        self.stream_batches = Counter(
            "warmgate_state_stream_batches",
            "Residency event batches read from the shared stream, by outcome "
            "(ok, malformed, gap, restart).",
            ["outcome"],
            registry=registry,
        )
        self.bindings = Counter(
            "warmgate_session_bindings",
            "Session bindings applied, by outcome (bound, kept, redirected, moved, unavailable).",
            ["outcome"],
            registry=registry,
        )

    def observers(self) -> SyncObservers:
        return SyncObservers(
            on_up=lambda up: self.redis_up.set(1 if up else 0),
            on_error=lambda op: self.errors.labels(op).inc(),
            on_stream_batch=lambda outcome: self.stream_batches.labels(outcome).inc(),
        )


def build_store(settings: StateSettings) -> SharedState:
    if settings.backend == "redis":
        assert settings.redis_url is not None  # the settings validator guarantees it
        return RedisState(settings.redis_url, settings.pool)
    return MemoryState(settings.pool)


def default_replica_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


async def attach_shared_state(state: AppState) -> None:
    """Called from the gateway's lifespan: start the shared-state tasks and the session
    bindings of this app."""
    settings = state.settings.state
    metrics = StateMetrics(state.metrics.registry)
    config = SyncConfig(
        replica=settings.replica_id or default_replica_id(),
        inflight_ttl_s=settings.inflight_ttl_s,
        observers=metrics.observers(),
    )
    sync = StateSync(
        build_store(settings),
        state.router.index,
        state.router.load,
        [i.id for i in state.settings.instances],
        config,
    )
    runtime = SessionBindings(sync, state.router, settings, metrics)
    try:
        await sync.call("ping", sync.store.ping, config.call_timeout_s * 4)
        await sync.bootstrap()
    except StateUnavailableError:
        pass  # the loops retry; routing goes on from local state meanwhile
    state.bindings = runtime
    state.readiness["shared_state"] = runtime.readiness
    state.closers.append(runtime.close)
    state.spawn(sync.run_inflight_sync(), "shared-inflight")
    state.spawn(sync.run_stream(), "shared-stream")
    state.spawn(sync.run_snapshots(), "shared-snapshots")
