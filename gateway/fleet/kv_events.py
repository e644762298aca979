"""KV event consumers: one ZMQ SUB socket and one task per instance that publishes events.

Each task receives `topic | seq | payload` messages from its instance's publisher (a vLLM
engine, `sim.engine --kv-events-endpoint`, or tierd), decoded by that publisher's wire (its
engine kind's `Engine.kv_events`; by default `gateway.engine.kv_wire.VLLM_EVENTS`, the
`contracts.kv_events` wire tierd speaks too), tracks the sequence number and feeds the
router's `PrefixIndex` (`router.event_feed.apply_events`, mediums as in `contracts.tiers`;
BlockRemoved removes; AllBlocksCleared clears the instance).

A sequence gap, a publisher restart (the sequence going back) or a batch whose payload does
not decode (a lost batch, as far as we can tell) drops what that publisher told us
(`router.event_feed.drop_publisher`, the rule the Redis stream reader follows too): stale
residency is worse than none, and predict-on-route plus the next events rebuild it. A
message whose frames are malformed is counted and skipped. Nothing a publisher sends can
stop a consumer task. Each replica subscribes directly: ZMQ PUB already fans out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import zmq
import zmq.asyncio
from prometheus_client import CollectorRegistry, Counter

from contracts.kv_events import BlockStored, MalformedEventError
from contracts.tiers import Tier
from gateway.config.settings import Settings
from gateway.engine.base import KvEventWire
from gateway.engine.kv_wire import VLLM_EVENTS
from gateway.fleet.kv_replay import ReplayUnavailable, fetch_replay
from gateway.lifetime import Lifetime
from router.event_feed import (
    IndexSink,
    SeqStatus,
    SeqTracker,
    apply_events,
    drop_publisher,
    elsewhere_of,
)
from router.index import ARRAY, PrefixIndex

log = logging.getLogger("warmgate.kv_events")


class KvEventMetrics:
    """`warmgate_kv_event_*` counters, on the gateway's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.batches = Counter(
            "warmgate_kv_event_batches",
            "KV event batches received, by instance and outcome (ok, malformed, gap, restart).",
            ["instance", "outcome"],
            registry=registry,
        )
        self.blocks = Counter(
            "warmgate_kv_event_blocks",
            "Blocks applied to the prefix index from KV events, by instance and action "
            "(stored, removed).",
            ["instance", "action"],
            registry=registry,
        )


@dataclass(slots=True)
class SourceStats:
    """What one instance's publisher has sent us."""

    instance: str
    endpoint: str
    batches: int = 0
    blocks_stored: int = 0
    blocks_removed: int = 0
    cleared: int = 0
    malformed: int = 0
    unknown_events: int = 0
    unknown_medium: int = 0
    other_topic: int = 0  # messages on another topic (check kv_events.topic if this grows)
    gaps: int = 0
    missed_batches: int = 0
    restarts: int = 0
    block_size_mismatch: int = 0  # batches with blocks of another size than precise mode's
    replays: int = 0  # resyncs from the engine's replay (start, restart, health recovery)
    replayed_batches: int = 0
    last_seq: int | None = None
    last_batch_at_s: float | None = None


class KvEventConsumer:
    """Feeds `index` from each instance's KV event endpoint (`instance -> endpoint`)."""

    def __init__(
        self,
        index: IndexSink,
        endpoints: Mapping[str, str],
        *,
        topic: str = "",
        metrics: KvEventMetrics | None = None,
        clock: Callable[[], float] = time.time,
        replay_endpoints: Mapping[str, str] | None = None,
        block_size: int | None = None,  # precise mode's: events of another size are flagged
        tiers: Mapping[str, Collection[Tier]] | None = None,
        wires: Mapping[str, KvEventWire] | None = None,  # absent: VLLM_EVENTS
    ) -> None:
        self.block_size = block_size
        # instance -> how its publisher's messages decode (its engine kind's wire)
        self.wires = dict(wires or {})
        # instance -> the tiers its publisher here owns, when it is one of several (an
        # engine's events beside its tierd's: `gateway.fleet.tierd_events`); absent: all tiers
        self.tiers = dict(tiers or {})
        self.index = index
        self.endpoints = dict(endpoints)
        self.replay_endpoints = dict(replay_endpoints or {})
        # instance -> live messages held back while its replay is being applied
        self._held: dict[str, list[list[bytes]]] = {}
        self._resyncs: set[asyncio.Task[int]] = set()
        self.topic = topic
        self.metrics = metrics
        self._clock = clock
        self._trackers = {i: SeqTracker() for i in self.endpoints}
        # instance -> blocks its publisher placed in the shared array (dropped on a resync)
        self._elsewhere: dict[str, dict[int, None]] = {}
        self._stats = {i: SourceStats(i, e) for i, e in self.endpoints.items()}
        self._ctx: zmq.asyncio.Context | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}

    async def start(self) -> None:
        self._ctx = zmq.asyncio.Context()
        for instance, endpoint in self.endpoints.items():
            self._subscribe(instance, endpoint)
        # what the engines hold already (the gateway may start after them)
        await asyncio.gather(*(self.resync(i, "start") for i in self.replay_endpoints))

    async def resync(self, instance: str, why: str) -> int:
        """Forget what `instance` holds and rebuild it from its engine's replay, when it
        offers one; returns the batches replayed. Live batches that arrive meanwhile are
        held and applied after the replay (those it already covered are dropped)."""
        self._drop(instance)
        endpoint = self.replay_endpoints.get(instance)
        stats = self._stats.get(instance)
        if endpoint is None or self._ctx is None or stats is None or instance in self._held:
            if instance in self._trackers:
                self._trackers[instance].reset()
            return 0
        self._held[instance] = []
        try:
            replay = self._wire(instance).replay
            batches = [] if replay is None else await fetch_replay(self._ctx, endpoint, replay)
        except (ReplayUnavailable, zmq.ZMQError) as exc:
            log.warning("kv events from %s: replay after %s failed: %s", instance, why, exc)
            batches = []
        finally:
            held = self._held.pop(instance, [])
        self._drop(instance)  # live batches since the clear are replayed too
        tracker = self._trackers[instance]
        tracker.reset()
        for frames in batches:
            self.handle(instance, frames)
        stats.replays += 1
        stats.replayed_batches += len(batches)
        last = tracker.last
        for frames in held:
            seq = int.from_bytes(frames[1], "big", signed=True) if len(frames) == 3 else None
            if seq is not None and last is not None and seq <= last:
                continue  # the replay had it
            self.handle(instance, frames)
        log.info("kv events from %s: %d batches replayed after %s", instance, len(batches), why)
        return len(batches)

    def _subscribe(self, instance: str, endpoint: str) -> None:
        assert self._ctx is not None
        sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 100_000)
        # Everything, then filter in `handle`: a topic mismatch (vLLM's default topic is
        # empty) then shows up in the stats instead of as silence.
        sock.setsockopt_string(zmq.SUBSCRIBE, "")
        sock.connect(endpoint)  # connects lazily and reconnects on its own
        task = asyncio.create_task(self._run(instance, sock), name=f"kv-events:{instance}")
        self._tasks[instance] = task

    def _spawn_resync(self, instance: str, why: str) -> None:
        task = asyncio.create_task(self.resync(instance, why), name=f"kv-resync:{instance}")
        self._resyncs.add(task)
        task.add_done_callback(self._resyncs.discard)

    def add_source(
        self,
        instance: str,
        endpoint: str,
        replay: str | None = None,
        *,
        tiers: Collection[Tier] | None = None,
        wire: KvEventWire | None = None,
    ) -> None:
        """Consume an instance added at runtime (gateway.fleet.runtime); `tiers`: what its publisher
        here owns, when it is one of several (None: all); `wire`: how its messages decode
        (None: VLLM_EVENTS)."""
        self.remove_source(instance)
        self.endpoints[instance] = endpoint
        if wire is not None:
            self.wires[instance] = wire
        if replay:
            self.replay_endpoints[instance] = replay
        if tiers is not None:
            self.tiers[instance] = tuple(tiers)
        self._trackers[instance] = SeqTracker()
        self._stats[instance] = SourceStats(instance, endpoint)
        self._subscribe(instance, endpoint)

    def remove_source(self, instance: str) -> None:
        """Stop consuming an instance that left the fleet (its socket closes in `_run`)."""
        task = self._tasks.pop(instance, None)
        if task is not None:
            task.cancel()
        self.endpoints.pop(instance, None)
        self.replay_endpoints.pop(instance, None)
        self.tiers.pop(instance, None)
        self.wires.pop(instance, None)
        self._stats.pop(instance, None)

    async def close(self) -> None:
        tasks = [*self._tasks.values(), *self._resyncs]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None

    def stats(self) -> dict[str, dict[str, Any]]:
        return {i: asdict(s) for i, s in self._stats.items()}

    async def _run(self, instance: str, sock: zmq.asyncio.Socket) -> None:
        try:
            while True:
                try:
                    frames = await sock.recv_multipart()
                except zmq.ZMQError as exc:  # a transient socket error: keep listening
                    log.warning("kv events from %s: %s", instance, exc)
                    await asyncio.sleep(0.1)
                    continue
                try:
                    self.handle(instance, frames)
                except Exception:  # never let one message stop the consumer
                    log.exception("kv events from %s: unexpected error, message skipped", instance)
                    if instance in self._stats:
                        self._stats[instance].malformed += 1
        finally:
            sock.close(linger=0)

    def handle(self, instance: str, frames: list[bytes]) -> None:
        """Process one received message for `instance` (synchronous: index updates are
        in-memory and short)."""
        stats = self._stats.get(instance)
        if stats is None:  # the instance left the fleet while this message was queued
            return
        held = self._held.get(instance)
        if held is not None:  # a replay is being fetched: apply this after it
            held.append(frames)
            return
        wire = self._wire(instance)
        try:
            message = wire.decode_frames(frames)
        except MalformedEventError as exc:
            self._count(stats, "malformed")
            log.warning("kv events from %s: malformed message skipped: %s", instance, exc)
            return
        if self.topic and message.topic != self.topic:
            stats.other_topic += 1
            return
        tracker = self._trackers[instance]
        verdict = tracker.observe(message.seq)
        stats.last_seq = message.seq
        stats.last_batch_at_s = self._clock()
        if verdict.must_resync:
            self._drop(instance)
            if instance in self.replay_endpoints:  # the engine can tell us what we missed
                self._spawn_resync(instance, verdict.status.value)
            if verdict.status is SeqStatus.GAP:
                stats.gaps += 1
                stats.missed_batches += verdict.missed
                self._count(stats, "gap")
                log.warning("kv events from %s: %d batches lost", instance, verdict.missed)
            else:
                stats.restarts += 1
                self._count(stats, "restart")
                log.info("kv events from %s: publisher restarted (seq %d)", instance, message.seq)
        try:
            batch = wire.decode_batch(message.payload)
        except MalformedEventError as exc:
            # The publisher's sequence moved on without us learning what changed.
            self._drop(instance)
            self._count(stats, "malformed")
            log.warning("kv events from %s: batch %d undecodable: %s", instance, message.seq, exc)
            return
        elsewhere_of(instance, batch.events, self._elsewhere.setdefault(instance, {}))
        if self.block_size is not None:
            self._check_block_size(instance, stats, batch.events)
        counts = apply_events(self.index, instance, batch.events, tiers=self.tiers.get(instance))
        stats.batches += 1
        stats.blocks_stored += counts.stored
        stats.blocks_removed += counts.removed
        stats.cleared += counts.cleared
        stats.unknown_events += batch.skipped
        stats.unknown_medium += counts.unknown_medium
        if self.metrics is not None:
            self.metrics.batches.labels(instance, "ok").inc()
            if counts.stored:
                self.metrics.blocks.labels(instance, "stored").inc(counts.stored)
            if counts.removed:
                self.metrics.blocks.labels(instance, "removed").inc(counts.removed)

    def _wire(self, instance: str) -> KvEventWire:
        return self.wires.get(instance, VLLM_EVENTS)

    def _drop(self, instance: str) -> None:
        """What this publisher told us goes (`router.event_feed.drop_publisher`)."""
        held = self._elsewhere.pop(instance, {})
        drop_publisher(self.index, instance, {(ARRAY, Tier.ARRAY): held}, self.tiers.get(instance))

    def _check_block_size(self, instance: str, stats: SourceStats, events: Any) -> None:
        """An engine whose blocks are not the size precise mode cuts can never match: say
        so loudly (the startup check covers engines that answered then; this, the rest)."""
        for ev in events:
            size = getattr(ev, "block_size", None)
            if isinstance(ev, BlockStored) and size and size != self.block_size:
                stats.block_size_mismatch += 1
                if stats.block_size_mismatch == 1:
                    log.error(
                        "kv events from %s: blocks of %d tokens, precise mode cuts %d: "
                        "no prediction for it can match; fix routing.precise.block_size",
                        instance,
                        size,
                        self.block_size,
                    )
                return

    def _count(self, stats: SourceStats, outcome: str) -> None:
        if outcome == "malformed":
            stats.malformed += 1
        if self.metrics is not None:
            self.metrics.batches.labels(stats.instance, outcome).inc()


async def start_kv_events(
    settings: Settings,
    index: PrefixIndex,
    registry: CollectorRegistry,
    life: Lifetime,
    tiers: Mapping[str, tuple[Tier, ...]],
) -> KvEventConsumer | None:
    """Called from the gateway's lifespan: consume each instance's KV events when enabled
    (`tiers`: the tiers an engine owns where its tierd publishes the others); None when not."""
    cfg = settings.kv_events
    endpoints = {i.id: i.kv_events_endpoint for i in settings.instances if i.kv_events_endpoint}
    replays = {
        i.id: i.kv_events_replay_endpoint
        for i in settings.instances
        if i.kv_events_endpoint and i.kv_events_replay_endpoint
    }
    if not cfg.enabled:
        return None
    if not endpoints:  # instances added at runtime may bring theirs (gateway.fleet.runtime)
        log.warning("kv_events.enabled but no configured instance has a kv_events_endpoint")
    consumer = KvEventConsumer(
        index,
        endpoints,
        topic=cfg.topic,
        metrics=KvEventMetrics(registry),
        replay_endpoints=replays,
        block_size=(
            settings.routing.precise.effective_block_size
            if settings.routing.mode == "precise"
            else None
        ),
        tiers=dict(tiers),
        wires={i.id: i.adapter.kv_events for i in settings.instances if i.id in endpoints},
    )
    await consumer.start()
    life.closers.append(consumer.close)

    async def readiness() -> dict[str, Any]:
        return {"ok": True, "required": False, "sources": consumer.stats()}

    life.readiness["kv_events"] = readiness
    return consumer
