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
from gateway.config.settings import InstanceSettings, Settings
from gateway.fleet.kv_events import KvEventConsumer
from gateway.lifetime import Lifetime
from router.index import PrefixIndex

ENGINE_TIERS: tuple[Tier, ...] = (Tier.HBM,)
TIERD_TIERS: tuple[Tier, ...] = (Tier.HOST, Tier.SNAPSHOT)


def tierd_endpoints(settings: Settings) -> dict[str, str]:
    """Instance id -> its tierd's events endpoint, for instances that name one."""
    return {i.id: i.tierd_events_endpoint for i in settings.instances if i.tierd_events_endpoint}


def engine_tiers(settings: Settings) -> dict[str, tuple[Tier, ...]]:
    """The tiers an engine's own publisher owns where a tierd publishes the others."""
    return dict.fromkeys(tierd_endpoints(settings), ENGINE_TIERS)


async def start_tierd_events(
    settings: Settings, index: PrefixIndex, life: Lifetime
) -> KvEventConsumer:
    """Consume every configured tierd's events (started with the engines' feed), and those
    of instances added at runtime (`subscribe`)."""
    endpoints = tierd_endpoints(settings)
    consumer = KvEventConsumer(
        index,
        endpoints,
        topic="",  # a socket of its own: nothing else arrives on it
        tiers=dict.fromkeys(endpoints, TIERD_TIERS),
    )
    await consumer.start()
    life.closers.append(consumer.close)

    async def readiness() -> dict[str, Any]:
        return {"ok": True, "required": False, "sources": consumer.stats()}

    life.readiness["tierd_events"] = readiness
    return consumer


def subscribe(
    engine: KvEventConsumer | None, tierd: KvEventConsumer | None, spec: InstanceSettings
) -> None:
    """An instance added at runtime (`gateway.fleet.runtime`): its engine's events and, if it names
    one, its tierd's, each publisher owning its tiers as at startup."""
    with_tierd = tierd is not None and spec.tierd_events_endpoint is not None
    if engine is not None and spec.kv_events_endpoint:
        engine.add_source(
            spec.id,
            spec.kv_events_endpoint,
            spec.kv_events_replay_endpoint,
            tiers=ENGINE_TIERS if with_tierd else None,
            wire=spec.adapter.kv_events,
        )
    if tierd is not None and spec.tierd_events_endpoint:
        tierd.add_source(spec.id, spec.tierd_events_endpoint, tiers=TIERD_TIERS)


def unsubscribe(
    engine: KvEventConsumer | None, tierd: KvEventConsumer | None, instance: str
) -> None:
    """An instance that left the fleet: neither of its publishers is read any more."""
    for consumer in (engine, tierd):
        if consumer is not None:
            consumer.remove_source(instance)
