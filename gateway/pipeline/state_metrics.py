"""The shared state's metrics: whether its store answers, failed calls, residency batches
read from the stream, session bindings by outcome."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from router.state.sync import SyncObservers


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
