"""Glue between the router and the shared state (router/state) inside one gateway replica.

Background tasks, all of them tolerant of the store going away:
- in-flight sync (every `sync_interval_s`): publish this replica's in-flight count per
  instance (TTL'd, so a dead replica's counts expire), read every other live replica's and
  feed the sums to `LoadView.set_remote`;
- event stream: bootstrap the residency of the shared stream (tierd's events: the array,
  L2/L3) from the snapshot key, then XREAD the stream in full from the snapshot's ID and
  apply each batch to the in-memory `PrefixIndex` (per-source sequence checks drop a
  source's blocks on a gap or restart);
- snapshot: every `snapshot_interval_s`, whoever holds the `snapshot` lock writes the
  residency encoding and the stream ID it covers.

Session bindings: with the Redis backend, a player's session key is bound to an instance
set-if-absent, so whichever replica routes a turn, the player lands where their KV is.
`lookup()` runs before routing (local cache, else one timeout-bounded GET; nothing while
Redis is down); `bind()` runs after routing and is synchronous, so no other request can
slip in between a decision and its dispatch (awaiting there made concurrent first turns
herd onto one instance); new bindings and moves are written in the background. A binding
yields when its instance is not a candidate (unhealthy) or clearly overloaded; then it
moves, compare-and-set. A single replica (memory backend) leaves routing to its policy,
which sees everything already; so do the session-blind baselines (round_robin, least_load).

If Redis goes away, routing goes on from local state; `warmgate_state_redis_up` drops to 0,
`/readyz` shows it (not required: serving continues), loops back off and retry; when Redis
returns, in-flight counts are republished on the next tick and the stream is read on from
where this replica stopped (re-bootstrapping from the snapshot if it was trimmed past that).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge

from gateway.settings import StateSettings
from gateway.state import AppState
from router.events import MalformedEventError, decode_batch
from router.router import Router
from router.state.base import (
    STREAM_START,
    SharedState,
    Snapshot,
    StateUnavailableError,
    stream_id_key,
)
from router.state.memory import MemoryState
from router.state.redis import RedisState
from router.state.residency import Residency
from router.types import Decision, RouteRequest, ordered_fallbacks

log = logging.getLogger("warmgate.shared")
T = TypeVar("T")

NON_AFFINE_POLICIES = frozenset({"round_robin", "least_load"})  # baselines that ignore sessions


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
            "Session binding lookups, by outcome (kept, redirected, moved, unavailable).",
            ["outcome"],
            registry=registry,
        )


class SharedRuntime:
    def __init__(
        self,
        store: SharedState,
        router: Router,
        instances: Sequence[str],
        settings: StateSettings,
        metrics: StateMetrics,
        *,
        sync_interval_s: float = 0.2,
        snapshot_interval_s: float = 30.0,
        call_timeout_s: float = 0.25,
        binding_cache_s: float = 5.0,
        binding_cache_max: int = 100_000,
        overload_factor: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.router = router
        self.instances = list(instances)
        self.settings = settings
        self.metrics = metrics
        self.replica = (
            settings.replica_id or f"{socket.gethostname()}-{os.getpid()}-" + (uuid.uuid4().hex[:6])
        )
        self.sync_interval_s = sync_interval_s
        self.snapshot_interval_s = snapshot_interval_s
        self.call_timeout_s = call_timeout_s
        self.binding_cache_s = binding_cache_s
        self.binding_cache_max = binding_cache_max
        self.overload_factor = overload_factor
        self._clock = clock
        self.residency = Residency()
        self.cursor = STREAM_START
        self.bootstrapped = False
        self.up = True
        self.down_since: float | None = None
        self.last_error: str | None = None
        self.remote_replicas: list[str] = []
        self._snapshot_cursor: str | None = None
        self._cache: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._pending: set[asyncio.Task[None]] = set()
        self.max_pending = 1000
        metrics.redis_up.set(1)

    # -- health of the store -------------------------------------------------------------

    async def _call(self, op: str, make: Callable[[], Awaitable[T]], timeout_s: float) -> T:
        try:
            result = await asyncio.wait_for(make(), timeout=timeout_s)
        except (StateUnavailableError, TimeoutError) as exc:
            self.metrics.errors.labels(op).inc()
            self._mark_down(f"{op}: {exc!r}")
            raise StateUnavailableError(str(exc)) from exc
        self._mark_up()
        return result

    def _mark_down(self, why: str) -> None:
        self.last_error = why
        if self.up:
            log.warning("shared state unavailable (%s): routing from local state", why)
            self.up = False
            self.down_since = self._clock()
            self.metrics.redis_up.set(0)

    def _mark_up(self) -> None:
        if not self.up:
            log.info(
                "shared state reachable again after %.1fs", self._clock() - (self.down_since or 0)
            )
            self.up = True
            self.down_since = None
            self.metrics.redis_up.set(1)

    async def readiness(self) -> dict[str, Any]:
        return {
            "ok": self.up,
            "required": False,  # an outage degrades routing, it does not stop serving
            "backend": self.store.backend,
            "pool": self.store.pool,
            "replica": self.replica,
            "remote_replicas": self.remote_replicas,
            "down_for_s": None if self.down_since is None else self._clock() - self.down_since,
            "last_error": self.last_error,
            "stream_cursor": self.cursor,
            "stream_sources": self.residency.sources(),
            "stream_blocks": self.residency.blocks(),
        }

    # -- in-flight sync ------------------------------------------------------------------

    async def sync_inflight_once(self) -> None:
        load = self.router.load
        counts = {i: load.local_in_flight(i) for i in self.instances}
        ttl = self.settings.inflight_ttl_s
        t = self.call_timeout_s
        await self._call(
            "publish_inflight", lambda: self.store.publish_inflight(self.replica, counts, ttl), t
        )
        loads = await self._call("read_inflight", self.store.read_inflight, t)
        others = [lo for lo in loads if lo.replica != self.replica]
        self.remote_replicas = sorted(lo.replica for lo in others)
        for instance in self.instances:
            load.set_remote(instance, sum(lo.counts.get(instance, 0) for lo in others))

    async def run_inflight_sync(self) -> None:
        backoff = self.sync_interval_s
        while True:
            try:
                await self.sync_inflight_once()
                backoff = self.sync_interval_s
            except StateUnavailableError:
                backoff = min(backoff * 2, 2.0)
                if self.down_since is not None and (
                    self._clock() - self.down_since > self.settings.inflight_ttl_s
                ):
                    for instance in self.instances:  # others' counts would have expired
                        self.router.load.set_remote(instance, 0)
            await asyncio.sleep(backoff)

    # -- event stream --------------------------------------------------------------------

    async def bootstrap(self) -> None:
        """Restore the stream's residency from the snapshot and read on from its ID."""
        snap = await self._call("load_snapshot", self.store.load_snapshot, self.call_timeout_s * 4)
        self.residency.drop_all(self.router.index)
        self.cursor = STREAM_START
        if snap is not None:
            try:
                n = self.residency.restore(snap.data, self.router.index)
                self.cursor = snap.stream_id
                log.info("bootstrapped %d blocks from the snapshot at %s", n, snap.stream_id)
            except MalformedEventError as exc:
                log.warning("snapshot unreadable, reading the stream from its start: %s", exc)
        self.bootstrapped = True

    async def _check_trimmed(self) -> None:
        """After an outage: if the stream was trimmed past our cursor, we missed entries."""
        if self.cursor == STREAM_START:
            return
        oldest = await self._call(
            "oldest_event_id", self.store.oldest_event_id, self.call_timeout_s
        )
        if oldest is not None and stream_id_key(oldest) > stream_id_key(self.cursor):
            log.warning("stream trimmed past %s (oldest %s): re-bootstrapping", self.cursor, oldest)
            await self.bootstrap()

    def apply_entry(self, instance: str, seq: int, batch: bytes) -> None:
        index = self.router.index
        try:
            decoded = decode_batch(batch)
        except MalformedEventError as exc:
            self.residency.lost(instance, seq, index)
            self.metrics.stream_batches.labels("malformed").inc()
            log.warning("stream batch %s/%d undecodable: %s", instance, seq, exc)
            return
        verdict, _ = self.residency.apply(instance, seq, decoded, index)
        if verdict.must_resync:
            self.metrics.stream_batches.labels(verdict.status.value).inc()
        self.metrics.stream_batches.labels("ok").inc()

    async def read_stream_once(self, block_s: float) -> int:
        if not self.bootstrapped:
            await self.bootstrap()
        timeout = block_s + self.call_timeout_s + 1.0
        entries = await self._call(
            "read_events", lambda: self.store.read_events(self.cursor, 1000, block_s), timeout
        )
        for entry in entries:
            self.apply_entry(entry.instance, entry.seq, entry.batch)
            self.cursor = entry.id
        return len(entries)

    async def run_stream(self) -> None:
        backoff = self.sync_interval_s
        was_up = True
        while True:
            try:
                if not was_up:
                    await self._check_trimmed()
                await self.read_stream_once(block_s=1.0)
                was_up, backoff = True, self.sync_interval_s
            except StateUnavailableError:
                was_up = False
                backoff = min(backoff * 2, 2.0)
                await asyncio.sleep(backoff)

    async def write_snapshot_once(self) -> bool:
        if not self.bootstrapped or self.cursor == self._snapshot_cursor:
            return False
        t = self.call_timeout_s
        ttl = self.snapshot_interval_s * 3
        if not await self._call(
            "acquire_lock", lambda: self.store.acquire_lock("snapshot", self.replica, ttl), t
        ):
            return False
        snap = Snapshot(self.residency.encode(), self.cursor, time.time())
        await self._call("save_snapshot", lambda: self.store.save_snapshot(snap), t * 4)
        self._snapshot_cursor = snap.stream_id
        return True

    async def run_snapshots(self) -> None:
        while True:
            await asyncio.sleep(self.snapshot_interval_s)
            with contextlib.suppress(StateUnavailableError):
                await self.write_snapshot_once()

    # -- session bindings ----------------------------------------------------------------

    def _cached(self, key: str) -> str | None:
        hit = self._cache.get(key)
        if hit is None or hit[1] <= self._clock():
            return None
        return hit[0]

    def _remember(self, key: str, instance: str) -> None:
        self._cache[key] = (instance, self._clock() + self.binding_cache_s)
        self._cache.move_to_end(key)
        while len(self._cache) > self.binding_cache_max:
            self._cache.popitem(last=False)

    def _overloaded(self, instance: str, candidates: Sequence[str]) -> bool:
        loads = [self.router.load.view(c)[0] for c in candidates]
        mean = sum(loads) / len(loads)
        return self.router.load.view(instance)[0] > self.overload_factor * mean + 4

    def _affine(self, rr: RouteRequest) -> str | None:
        """The session key when bindings apply to this request (see the module docstring)."""
        if (
            not rr.session_key
            or self.store.backend == "memory"
            or self.router.policy.name in NON_AFFINE_POLICIES
        ):
            return None
        return rr.session_key

    async def lookup(self, rr: RouteRequest) -> str | None:
        """Before routing: the player's bound instance, from the local cache or one
        timeout-bounded call (which refreshes the binding's TTL). None when unbound or when
        the store is down."""
        key = self._affine(rr)
        if key is None:
            return None
        bound = self._cached(key)
        if bound is not None or not self.up:
            return bound
        try:
            bound = await self._call(
                "get_session",
                lambda: self.store.get_session(key, self.settings.session_ttl_s),
                self.call_timeout_s,
            )
        except StateUnavailableError:
            self.metrics.bindings.labels("unavailable").inc()
            return None
        if bound is not None:
            self._remember(key, bound)
        return bound

    def bind(self, rr: RouteRequest, decision: Decision, candidates: Sequence[str]) -> Decision:
        """After routing, synchronously (nothing may run between a decision and its
        dispatch): follow the binding `lookup()` found, or record a new one in the
        background (set-if-absent: if another replica bound the player first, its choice is
        adopted from the next turn on)."""
        key = self._affine(rr)
        if key is None or len(candidates) < 2:
            return decision
        bound = self._cached(key)
        if bound is None:
            self._remember(key, decision.instance)  # provisional until the store answers
            self._background(self._bind_new(key, decision.instance))
            self.metrics.bindings.labels("bound").inc()
            return decision
        if bound == decision.instance:
            self.metrics.bindings.labels("kept").inc()
            return decision
        if bound in candidates and not self._overloaded(bound, candidates):
            self.metrics.bindings.labels("redirected").inc()
            return _redirect(decision, bound)
        # The bound instance is unhealthy or overloaded: move the player, compare-and-set.
        self._remember(key, decision.instance)
        self._background(self._move(key, bound, decision.instance))
        self.metrics.bindings.labels("moved").inc()
        return decision

    def _background(self, coro: Coroutine[Any, Any, None]) -> None:
        if len(self._pending) >= self.max_pending or not self.up:
            coro.close()  # the store is slow or down: the binding waits for a later turn
            return
        task = asyncio.create_task(coro)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _bind_new(self, key: str, instance: str) -> None:
        ttl = self.settings.session_ttl_s
        with contextlib.suppress(StateUnavailableError):
            winner = await self._call(
                "bind_session",
                lambda: self.store.bind_session(key, instance, ttl),
                self.call_timeout_s,
            )
            self._remember(key, winner)

    async def _move(self, key: str, old: str, new: str) -> None:
        ttl = self.settings.session_ttl_s
        with contextlib.suppress(StateUnavailableError):
            moved = await self._call(
                "rebind_session",
                lambda: self.store.rebind_session(key, old, new, ttl),
                self.call_timeout_s,
            )
            self._remember(key, moved)

    async def close(self) -> None:
        for task in list(self._pending):
            task.cancel()
        await asyncio.gather(*self._pending, return_exceptions=True)
        await self.store.close()


def _redirect(decision: Decision, instance: str) -> Decision:
    score = next((c for c in decision.candidates if c.instance == instance), None)
    by_tier = dict(score.cached_tokens_by_tier) if score is not None else {}
    return dataclasses.replace(
        decision,
        instance=instance,
        reason=f"session binding (policy chose {decision.instance}: {decision.reason})",
        cached_tokens=sum(by_tier.values()),
        cached_tokens_by_tier=by_tier,
        predicted_ttft_s=score.predicted_ttft_s if score is not None else None,
        fallbacks=ordered_fallbacks(instance, [decision.instance, *decision.fallbacks]),
    )


def build_store(settings: StateSettings) -> SharedState:
    if settings.backend == "redis":
        assert settings.redis_url is not None  # the settings validator guarantees it
        return RedisState(settings.redis_url, settings.pool)
    return MemoryState(settings.pool)


async def attach(state: AppState) -> None:
    """Called from the gateway's lifespan: start the shared-state tasks for this app."""
    settings = state.settings.state
    store = build_store(settings)
    runtime = SharedRuntime(
        store,
        state.router,
        [i.id for i in state.settings.instances],
        settings,
        StateMetrics(state.metrics.registry),
    )
    try:
        await runtime._call("ping", store.ping, runtime.call_timeout_s * 4)
        await runtime.bootstrap()
    except StateUnavailableError:
        pass  # the loops retry; routing goes on from local state meanwhile
    state.extensions["shared"] = runtime
    state.readiness["shared_state"] = runtime.readiness
    state.closers.append(runtime.close)
    state.spawn(runtime.run_inflight_sync(), "shared-inflight")
    state.spawn(runtime.run_stream(), "shared-stream")
    state.spawn(runtime.run_snapshots(), "shared-snapshots")
