"""One tier daemon: the store and its helpers (loader, prefetcher, snapshotter) and the
event publisher, built and torn down together; the HTTP API talks only to this."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from contracts.errors import InputError
from contracts.tiers import TIERD_LEVELS
from tierd import events as ev
from tierd.engine_events import EngineEvents
from tierd.events import EventPublisher
from tierd.hints import HintLedger
from tierd.kvserver import KvServer
from tierd.loader import Loader
from tierd.prefetch import ChainPrefetcher
from tierd.residency import EngineResidency
from tierd.settings import TierdSettings
from tierd.snapshotter import Snapshotter
from tierd.stats import store_stats
from tierd.store import TieredStore

MEDIUMS = tuple(lv.name for lv in TIERD_LEVELS)  # tierd's names of its levels (its API)

log = logging.getLogger("tierd")


class UnknownTierError(InputError, ValueError):
    """An eviction asked of a tier tierd does not have."""


class Daemon:
    """Everything one tierd owns."""

    def __init__(
        self, settings: TierdSettings, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.settings = settings
        self.events = EventPublisher(
            settings.instance_id,
            endpoint=settings.events_endpoint,
            topic=settings.events_topic,
            redis_url=settings.redis_url,
            pool=settings.pool,
            maxlen=settings.stream_maxlen,
        )
        self.store = TieredStore(settings, self.events, clock)
        self.loader = Loader(self.store)
        self.hints = HintLedger()  # prefetch on time? (the hint, then the engine's ask)
        self.store.on_l1_evicted = self.hints.evicted
        # what the engine holds, known only from its KV events
        self.residency: EngineResidency | None = None
        if settings.kv_socket is not None and settings.engine_events:
            self.residency = EngineResidency()
        self.prefetcher = ChainPrefetcher(self.store, self.loader, self.hints, self.residency)
        self.snapshotter = Snapshotter(self.store)
        self.kv: KvServer | None = None
        if settings.kv_socket is not None:
            self.kv = KvServer(
                self.store, self.loader, settings.kv_socket, self.hints, self.residency
            )
        self.engine_events: EngineEvents | None = None
        if self.kv is not None and settings.engine_events:
            self.engine_events = EngineEvents(settings.engine_events, self.kv)
        self._background: set[asyncio.Task[Any]] = set()
        self.opening: asyncio.Task[None] | None = None
        self.open_error: str | None = None
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start publishing (first event: this instance's L1 is empty) and rebuild the
        indexes in the background, so a large array does not hold up /livez."""
        await self.events.start()
        self.events.all_cleared()
        self.opening = asyncio.create_task(self.store.open(), name="tierd-open")
        self.opening.add_done_callback(self._opened)
        self._sweeper = asyncio.create_task(self._sweep(), name="tierd-sweep")
        if self.kv is not None:
            await self.kv.start()
        if self.engine_events is not None:
            await self.engine_events.start()

    async def _sweep(self) -> None:
        """End idle dialogues' protection (and snapshot them) even when nothing is put."""
        interval = min(5.0, self.settings.session_ttl_s / 4)
        while True:
            await asyncio.sleep(interval)
            self.store.expire_sessions()

    def _opened(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        if task.exception() is not None:
            self.open_error = repr(task.exception())
            log.error("rebuilding the tier indexes failed: %s", self.open_error)
            return
        st = self.store
        log.info(
            "tierd %s ready: L1 %d slots of %d bytes (%s), array %s (%d slices recovered, "
            "o_direct %s), snapshots %s (%d slices recovered), %d corrupt quarantined",
            self.settings.instance_id,
            st.l1.slots,
            st.l1.slot_bytes,
            st.l1.backend,
            self.settings.array_dir,
            st.counters.recovered["array"],
            st.array.direct,
            self.settings.snapshot_dir,
            st.counters.recovered["snapshot"],
            st.counters.corrupt["array"],
        )

    async def wait_ready(self) -> None:
        """Until the indexes are rebuilt (raises what rebuilding raised)."""
        if self.opening is not None:
            await asyncio.shield(self.opening)

    async def close(self) -> None:
        if self.engine_events is not None:
            await self.engine_events.close()
        if self.kv is not None:
            await self.kv.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        if self.opening is not None and not self.opening.done():
            self.opening.cancel()
            await asyncio.gather(self.opening, return_exceptions=True)
        for t in list(self._background):
            t.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self.loader.close()
        await self.snapshotter.close()
        await self.events.close()
        self.store.close()

    def prefetch_in_background(
        self, hashes: list[int], deadline_s: float, session: str | None
    ) -> None:
        """Fire and forget: the caller never waits for a hint."""
        task = asyncio.create_task(self.prefetcher.prefetch(hashes, deadline_s, session))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def drain(self) -> None:
        """Wait for the background prefetches accepted so far."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    async def evict(self, hashes: list[int] | None, tier: str) -> int:
        st = self.store
        if tier == ev.GPU:
            return await st.evict_l1(hashes)
        if tier == ev.ARRAY:
            todo = list(st.array_index) if hashes is None else hashes
            for h in todo:
                await asyncio.to_thread(st.array.delete, h)
            known = [h for h in todo if h in st.array_index]
            for h in known:
                st.array_forget(h)
            st.counters.evictions["array"] += len(known)
            st.events.removed(ev.ARRAY, known)
            return len(known)
        if tier == ev.SNAPSHOT:
            todo = list(st.snap_index) if hashes is None else hashes
            sids = {st.snap_index[h] for h in todo if h in st.snap_index}
            n = 0
            for sid in sids:
                await asyncio.to_thread(st.snapshots_dir.delete, sid)
                n += len(st.forget_snapshot(sid))
            st.counters.evictions["snapshot"] += n
            return n
        raise UnknownTierError(f"unknown tier {tier!r}; one of {MEDIUMS}")

    def stats(self) -> dict[str, Any]:
        out = store_stats(self.store)
        out["instance_id"] = self.settings.instance_id
        out["open_error"] = self.open_error
        out["in_flight_transfers"] = self.loader.in_flight
        out["connector"] = self.kv.stats() if self.kv is not None else None
        out["engine_events"] = self.engine_events.stats() if self.engine_events else None
        out["engine_held_blocks"] = len(self.residency) if self.residency is not None else None
        return out
