"""tierd's residency events into the prefix index the engines' events feed (issue 12 §3).

An instance with a tierd beside its engine has two publishers: the engine (its own KV cache,
`Tier.HBM`) and its tierd (host memory `Tier.HOST`, snapshots `Tier.SNAPSHOT`, and the
blocks it wrote to the shared array). `InstanceSettings.tierd_events_endpoint` names the
tierd's ZMQ PUB endpoint (`tierd serve --events-endpoint`); the gateway subscribes to it with
a second `KvEventConsumer` over the same index, and each publisher owns its own tiers: a gap
or restart of one (or its AllBlocksCleared) clears only what that one said, never the
other's. Without it the router priced only the engine's own cache, and a request the
engine served partly from tierd was under-predicted (`bench compare --tiers`: 5 of 121).
"""

from __future__ import annotations

from typing import Any

from contracts.tiers import Tier
from gateway.kv_events import KvEventConsumer
from gateway.settings import Settings
from gateway.state import AppState

ENGINE_TIERS: tuple[Tier, ...] = (Tier.HBM,)
TIERD_TIERS: tuple[Tier, ...] = (Tier.HOST, Tier.SNAPSHOT)


def tierd_endpoints(settings: Settings) -> dict[str, str]:
    """Instance id -> its tierd's events endpoint, for instances that name one."""
    return {i.id: i.tierd_events_endpoint for i in settings.instances if i.tierd_events_endpoint}


def engine_tiers(settings: Settings) -> dict[str, tuple[Tier, ...]]:
    """The tiers an engine's own publisher owns where a tierd publishes the others."""
    return dict.fromkeys(tierd_endpoints(settings), ENGINE_TIERS)


async def attach_tierd_events(state: AppState) -> KvEventConsumer | None:
    """Consume every configured tierd's events (called by `attach_kv_events`)."""
    endpoints = tierd_endpoints(state.settings)
    if not endpoints:
        return None
    consumer = KvEventConsumer(
        state.router.index,
        endpoints,
        topic="",  # a socket of its own: nothing else arrives on it
        tiers=dict.fromkeys(endpoints, TIERD_TIERS),
    )
    await consumer.start()
    state.closers.append(consumer.close)

    async def readiness() -> dict[str, Any]:
        return {"ok": True, "required": False, "sources": consumer.stats()}

    state.readiness["tierd_events"] = readiness
    return consumer
