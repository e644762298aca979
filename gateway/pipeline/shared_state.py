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

from prometheus_client import CollectorRegistry

from gateway.config.settings import Settings, StateSettings
from gateway.lifetime import Lifetime
from gateway.pipeline.session_bindings import SessionBindings
from gateway.pipeline.state_metrics import StateMetrics
from router.router import Router
from router.state.base import SharedState, StateUnavailableError
from router.state.memory import MemoryState
from router.state.redis import RedisState
from router.state.sync import StateSync, SyncConfig


def build_store(settings: StateSettings) -> SharedState:
    if settings.backend == "redis":
        assert settings.redis_url is not None  # the settings validator guarantees it
        return RedisState(settings.redis_url, settings.pool)
    return MemoryState(settings.pool)


def default_replica_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


async def start_shared_state(
    settings: Settings, router: Router, registry: CollectorRegistry, life: Lifetime
) -> SessionBindings:
    """Called from the gateway's lifespan: start the shared-state tasks; the session
    bindings of this app over them."""
    instances = [i.id for i in settings.instances]
    settings_state = settings.state
    metrics = StateMetrics(registry)
    config = SyncConfig(
        replica=settings_state.replica_id or default_replica_id(),
        inflight_ttl_s=settings_state.inflight_ttl_s,
        observers=metrics.observers(),
    )
    sync = StateSync(build_store(settings_state), router.index, router.load, instances, config)
    runtime = SessionBindings(sync, router, settings_state, metrics)
    try:
        await sync.call("ping", sync.store.ping, config.call_timeout_s * 4)
        await sync.bootstrap()
    except StateUnavailableError:
        pass  # the loops retry; routing goes on from local state meanwhile
    life.readiness["shared_state"] = runtime.readiness
    life.closers.append(runtime.close)
    if sync.store.shared:
        life.spawn(sync.run_inflight_sync(), "shared-inflight")
        life.spawn(sync.run_stream(), "shared-stream")
        life.spawn(sync.run_snapshots(), "shared-snapshots")
    # else (`memory`): this process is the store's only reader and writer (no other replica,
    # no tierd reaches it), so there is nothing to publish or read back; the loops would wake
    # the gateway six times a second for nothing (docs/BENCHMARKS.md, the idle gateway)
    return runtime
