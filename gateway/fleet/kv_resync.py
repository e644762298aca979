"""What the router believes an instance caches does not outlive the instance's health.

An instance that turns unhealthy may be restarting with an empty cache (measured: down 42 s,
back empty, and the next request predicted 3,584 cached tokens that were not there), so its
index entries are dropped at once. When it is healthy again its KV events consumer asks the
engine's replay for what it holds (vLLM's `replay_endpoint`); without one the index starts
empty for it and fills again from new events and predictions.
"""

from __future__ import annotations

import logging

from gateway.fleet.health import HealthState
from gateway.state import AppState

log = logging.getLogger("warmgate.kv_resync")


def attach_health_resync(state: AppState) -> None:
    """Register the health listener (call after the extensions are attached)."""

    def on_change(instance: str, old: HealthState, new: HealthState) -> None:
        consumer = state.kv_events
        if new == "unhealthy":
            state.router.index.clear_instance(instance)
            log.info("instance %s unhealthy: its prefix index entries are dropped", instance)
        elif new == "healthy" and old == "unhealthy":
            state.router.index.clear_instance(instance)
            if consumer is not None:
                state.spawn(consumer.resync(instance, "health recovery"), f"resync:{instance}")

    state.health.listeners.append(on_change)
