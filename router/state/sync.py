"""Keeps one replica's router in step with the pool's shared state, whatever the store does.

Three loops, each tolerant of the store going away (calls are timeout-bounded; failures
mark the store down, the loops back off up to 2 s and retry; routing never waits on them):
- in-flight sync (every `sync_interval_s`): publish this replica's in-flight count per
  instance (TTL'd, so a dead replica's counts expire), read every other live replica's and
  feed the sums to `LoadView.set_remote`; after an outage longer than the TTL the remote
  counts are zeroed, as the store would have expired them;
- event stream: bootstrap the stream's residency from the snapshot key, then read the
  stream in full from the snapshot's ID, applying each batch to the in-memory index
  (`Residency`: per-source sequence checks drop a source's blocks on a gap or restart);
  after an outage, if the stream was trimmed past our cursor, bootstrap again;
- snapshot (every `snapshot_interval_s`): whoever holds the `snapshot` lock writes the
  residency encoding and the stream ID it covers, when that ID moved.

Observers (the gateway's metrics) get `on_up(bool)`, `on_error(op)` and
`on_stream_batch(outcome)` calls; this module imports nothing outside `router`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from contracts.kv_events import MalformedEventError, decode_batch
from router.index import PrefixIndex
from router.load import LoadView
from router.state.base import (
    STREAM_START,
    SharedState,
    Snapshot,
    StateUnavailableError,
    stream_id_key,
)
from router.state.redact import redact
from router.state.residency import Residency

log = logging.getLogger("warmgate.state")
T = TypeVar("T")
MAX_BACKOFF_S = 2.0


def _ignore(*_: Any) -> None:
    return None


@dataclass
class SyncObservers:
    on_up: Callable[[bool], None] = _ignore
    on_error: Callable[[str], None] = _ignore
    on_stream_batch: Callable[[str], None] = _ignore


@dataclass
class SyncConfig:
    replica: str
    inflight_ttl_s: float = 15.0
    sync_interval_s: float = 0.2
    snapshot_interval_s: float = 30.0
    call_timeout_s: float = 0.25
    stream_block_s: float = 1.0
    stream_count: int = 1000
    observers: SyncObservers = field(default_factory=SyncObservers)


class StateSync:
    def __init__(
        self,
        store: SharedState,
        index: PrefixIndex,
        load: LoadView,
        instances: Sequence[str],
        config: SyncConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.index = index
        self.load = load
        self.instances = list(instances)
        self.config = config
        self.replica = config.replica
        self._obs = config.observers
        self._clock = clock
        self.residency = Residency()
        self.cursor = STREAM_START
        self.bootstrapped = False
        self.up = True
        self.down_since: float | None = None
        self.last_error: str | None = None
        self.remote_replicas: list[str] = []
        self._snapshot_cursor: str | None = None
        self._obs.on_up(True)

    # -- health of the store -------------------------------------------------------------

    async def call(self, op: str, make: Callable[[], Awaitable[T]], timeout_s: float) -> T:
        """One store call, bounded by `timeout_s`; failures raise `StateUnavailableError`
        and mark the store down, success marks it up."""
        try:
            async with asyncio.timeout(timeout_s):  # no task per call, as wait_for makes
                result = await make()
        except (StateUnavailableError, TimeoutError) as exc:
            self._obs.on_error(op)
            self._mark_down(f"{op}: {exc!r}")
            raise StateUnavailableError(str(exc)) from exc
        self._mark_up()
        return result

    def _mark_down(self, why: str) -> None:
        why = redact(why)  # connection errors may quote the URL, password and all
        self.last_error = why
        if self.up:
            log.warning("shared state unavailable (%s): routing from local state", why)
            self.up = False
            self.down_since = self._clock()
            self._obs.on_up(False)

    def _mark_up(self) -> None:
        if not self.up:
            down_for = self._clock() - (self.down_since or self._clock())
            log.info("shared state reachable again after %.1fs", down_for)
            self.up = True
            self.down_since = None
            self._obs.on_up(True)

    def status(self) -> dict[str, Any]:
        return {
            "ok": self.up,
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
        counts = {i: self.load.local_in_flight(i) for i in self.instances}
        ttl, t = self.config.inflight_ttl_s, self.config.call_timeout_s
        await self.call(
            "publish_inflight", lambda: self.store.publish_inflight(self.replica, counts, ttl), t
        )
        loads = await self.call("read_inflight", self.store.read_inflight, t)
        others = [lo for lo in loads if lo.replica != self.replica]
        self.remote_replicas = sorted(lo.replica for lo in others)
        for instance in self.instances:
            self.load.set_remote(instance, sum(lo.counts.get(instance, 0) for lo in others))

    async def run_inflight_sync(self) -> None:
        backoff = self.config.sync_interval_s
        while True:
            try:
                await self.sync_inflight_once()
                backoff = self.config.sync_interval_s
            except StateUnavailableError:
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                if self.down_since is not None and (
                    self._clock() - self.down_since > self.config.inflight_ttl_s
                ):
                    self.remote_replicas = []
                    for instance in self.instances:  # others' counts would have expired
                        self.load.set_remote(instance, 0)
            await asyncio.sleep(backoff)

    # -- event stream --------------------------------------------------------------------

    async def bootstrap(self) -> None:
        """Restore the stream's residency from the snapshot and read on from its ID."""
        t = self.config.call_timeout_s * 4
        snap = await self.call("load_snapshot", self.store.load_snapshot, t)
        self.residency.drop_all(self.index)
        self.cursor = STREAM_START
        if snap is not None:
            try:
                n = self.residency.restore(snap.data, self.index)
                self.cursor = snap.stream_id
                log.info("bootstrapped %d blocks from the snapshot at %s", n, snap.stream_id)
            except MalformedEventError as exc:
                log.warning("snapshot unreadable, reading the stream from its start: %s", exc)
        self.bootstrapped = True

    async def _check_trimmed(self) -> None:
        """After an outage: if the stream was trimmed past our cursor, we missed entries."""
        if self.cursor == STREAM_START:
            return
        t = self.config.call_timeout_s
        oldest = await self.call("oldest_event_id", self.store.oldest_event_id, t)
        if oldest is not None and stream_id_key(oldest) > stream_id_key(self.cursor):
            log.warning("stream trimmed past %s (oldest %s): re-bootstrapping", self.cursor, oldest)
            await self.bootstrap()

    def apply_entry(self, instance: str, seq: int, batch: bytes) -> None:
        try:
            decoded = decode_batch(batch)
        except MalformedEventError as exc:
            self.residency.lost(instance, seq, self.index)
            self._obs.on_stream_batch("malformed")
            log.warning("stream batch %s/%d undecodable: %s", instance, seq, exc)
            return
        verdict, _ = self.residency.apply(instance, seq, decoded, self.index)
        if verdict.must_resync:
            self._obs.on_stream_batch(verdict.status.value)
        self._obs.on_stream_batch("ok")

    async def read_stream_once(self, block_s: float) -> int:
        if not self.bootstrapped:
            await self.bootstrap()
        timeout = block_s + self.config.call_timeout_s + 1.0
        count = self.config.stream_count
        entries = await self.call(
            "read_events", lambda: self.store.read_events(self.cursor, count, block_s), timeout
        )
        for entry in entries:
            self.apply_entry(entry.instance, entry.seq, entry.batch)
            self.cursor = entry.id
        return len(entries)

    async def run_stream(self) -> None:
        backoff = self.config.sync_interval_s
        was_up = True
        while True:
            try:
                if not was_up:
                    await self._check_trimmed()
                await self.read_stream_once(self.config.stream_block_s)
                was_up, backoff = True, self.config.sync_interval_s
            except StateUnavailableError:
                was_up = False
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                await asyncio.sleep(backoff)

    # -- snapshot ------------------------------------------------------------------------

    async def write_snapshot_once(self) -> bool:
        """Write the snapshot if this replica holds (or takes) the lock and has news."""
        if not self.bootstrapped or self.cursor == self._snapshot_cursor:
            return False
        t = self.config.call_timeout_s
        ttl = self.config.snapshot_interval_s * 3
        if not await self.call(
            "acquire_lock", lambda: self.store.acquire_lock("snapshot", self.replica, ttl), t
        ):
            return False
        snap = Snapshot(self.residency.encode(), self.cursor, time.time())
        await self.call("save_snapshot", lambda: self.store.save_snapshot(snap), t * 4)
        self._snapshot_cursor = snap.stream_id
        return True

    async def run_snapshots(self) -> None:
        while True:
            await asyncio.sleep(self.config.snapshot_interval_s)
            with contextlib.suppress(StateUnavailableError):
                await self.write_snapshot_once()
