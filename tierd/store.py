"""The tiered slice store: L1 arena ⇄ L2 array ⇄ L3 snapshots, and the policies between them.

- Puts land in L1. When L1 is full, victims are chosen by LRU-K (K=2) over L1, passing over
  slices protected because their dialogue was active in its last two turns
  (`tierd.sessions`) and slices being read. Protection yields if it would wedge the store:
  the oldest session loses it first.
- Demotion writes down before it frees: a victim is written to the array (temp + rename)
  and only then removed from L1. Frequency gate before the slow tier: a victim is written
  down only if it was touched at least twice (puts and gets count; the history outlives
  eviction) or was put with a session key (a dialogue its player will come back to);
  otherwise it is dropped (counted as `gated`). A slice already in the array is not
  rewritten.
- Loads into L1 (gets and prefetches) are single-flight and live in `tierd.loader`;
  prefetch deadlines in `tierd.prefetch`; snapshots and array trimming in
  `tierd.snapshotter`.
- On open, the array and snapshot indexes are rebuilt from file headers and manifests;
  torn temp files are ignored and cleaned; bad files are quarantined.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from contracts.errors import InputError
from contracts.tiers import Tier
from tierd import events as ev
from tierd.chain_lookup import chain_summary, probe_array
from tierd.counters import DropLog, StoreCounters, ThroughputMeter
from tierd.emulation import Emulator
from tierd.events import EventPublisher
from tierd.eviction import AccessHistory, LruK
from tierd.sessions import SessionTracker
from tierd.settings import TierdSettings
from tierd.slices import Payload, SliceMeta, make_meta
from tierd.tiers.l1_arena import L1Arena
from tierd.tiers.l2_array import ArrayDir
from tierd.tiers.l3_snapshots import Snapshot, SnapshotDir

log = logging.getLogger("tierd.store")

DEMOTE_BATCH = 16
EVENT_GROUP = 512


class SliceTooLargeError(InputError, ValueError):
    """A put larger than one L1 slot."""


class TieredStore:
    """All slices of one tierd and the rules that move them between tiers."""

    def __init__(
        self,
        settings: TierdSettings,
        events: EventPublisher,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.events = events
        self.clock = clock
        self.counters = StoreCounters()
        self.drops = DropLog()  # victims the array could not take
        self.history = AccessHistory(settings.lru_k, settings.history_entries)
        self.sessions = SessionTracker(settings.session_ttl_s, settings.max_sessions, clock)
        self.emulator = Emulator(
            settings.emulate, settings.array_gbps, settings.snapshot_gbps, settings.time_scale
        )
        backend = "shm" if settings.kv_socket is not None else settings.l1_backend
        self.l1 = L1Arena(settings.l1_bytes, settings.slice_bytes, backend)
        self.l1_order = LruK(self.history)
        self.array = ArrayDir(
            settings.array_dir, settings.slice_bytes, fsync=settings.fsync,
            allow_direct=settings.array_o_direct,
        )  # fmt: skip
        self.array_index: dict[int, SliceMeta | None] = {}
        self.array_order = LruK(self.history)
        self.array_bytes = 0
        self.snapshots_dir = SnapshotDir(settings.snapshot_dir, settings.zstd_level)
        self.snap_index: dict[int, str] = {}
        self.snapshots: dict[str, Snapshot] = {}
        # L3 evicts whole objects: LRU-K over snapshot ids (each given a small int key)
        self.snap_history = AccessHistory(settings.lru_k, settings.history_entries)
        self.snap_order = LruK(self.snap_history)
        self.snap_keys: dict[str, int] = {}
        self.snap_ids: dict[int, str] = {}
        self.snapshot_bytes = 0
        self._snap_seq = itertools.count(1)
        # load rates into L1 by Tier.label (the KV socket adds "host": L1 -> the engine)
        self.meters = {Tier.ARRAY.label: ThroughputMeter(), Tier.SNAPSHOT.label: ThroughputMeter()}
        self.ready = False
        self._room = asyncio.Lock()
        self._evicting: set[int] = set()
        self.on_array_grew: Callable[[], None] | None = None
        self.on_session_idle: Callable[[list[int]], None] | None = None
        self.on_l1_evicted: Callable[[list[int]], None] | None = None  # the hint ledger

    # -- life cycle ----------------------------------------------------------------------

    async def open(self) -> None:
        """Rebuild the array and snapshot indexes from disk; announce what survived.

        Slices are served meanwhile (a get or lookup of a hash not indexed yet looks at the
        directory itself); `ready` turns true when the indexes are complete."""
        grace = self.settings.temp_grace_s
        await asyncio.to_thread(self.array.probe)
        found, bad, _ = await asyncio.to_thread(self.array.scan, grace)
        snaps, _ = await asyncio.to_thread(self.snapshots_dir.scan, grace)
        for h, meta in found.items():
            self.array_add(h, meta)
        self.counters.recovered["array"] += len(found)
        self.counters.corrupt["array"] += len(bad)
        hashes = list(found)
        for i in range(0, len(hashes), EVENT_GROUP):
            self.events.stored(ev.ARRAY, hashes[i : i + EVENT_GROUP], None, None)
        for snap in snaps:
            self.add_snapshot(snap)
            self.counters.recovered["snapshot"] += len(snap.entries)
        self.ready = True

    def close(self) -> None:
        self.ready = False
        self.l1.close()

    # -- bookkeeping shared with loader / snapshotter ------------------------------------

    def array_add(self, h: int, meta: SliceMeta | None) -> None:
        if h not in self.array_index or (meta is not None and self.array_index[h] is None):
            old = self.array_index.get(h)
            self.array_bytes += (meta.length if meta else 0) - (old.length if old else 0)
            self.array_index[h] = meta
        self.array_order.update(h)

    def array_forget(self, h: int) -> None:
        meta = self.array_index.pop(h, None)
        if meta is not None:
            self.array_bytes -= meta.length
        self.array_order.remove(h)

    def add_snapshot(self, snap: Snapshot) -> None:
        if snap.id in self.snapshots:
            self.touch_snapshot(snap.id)
            return
        self.snapshots[snap.id] = snap
        self.snapshot_bytes += snap.object_bytes
        key = next(self._snap_seq)
        self.snap_keys[snap.id] = key
        self.snap_ids[key] = snap.id
        self.touch_snapshot(snap.id)
        for m in snap.entries:
            self.snap_index[m.hash] = snap.id
        if snap.entries:
            first = snap.entries[0]
            self.events.stored(
                ev.SNAPSHOT, [m.hash for m in snap.entries], first.parent, first.tokens
            )

    def touch_snapshot(self, snap_id: str) -> None:
        key = self.snap_keys.get(snap_id)
        if key is not None:
            self.snap_history.touch(key)
            self.snap_order.update(key)

    def forget_snapshot(self, snap_id: str) -> list[int]:
        snap = self.snapshots.pop(snap_id, None)
        if snap is None:
            return []
        self.snapshot_bytes -= snap.object_bytes
        key = self.snap_keys.pop(snap_id)
        del self.snap_ids[key]
        self.snap_order.remove(key)
        gone = list(
            dict.fromkeys(m.hash for m in snap.entries if self.snap_index.get(m.hash) == snap_id)
        )
        for h in gone:
            del self.snap_index[h]
        self.events.removed(ev.SNAPSHOT, gone)
        return gone

    def note_corrupt(self, tier: str, hashes: list[int]) -> None:
        self.counters.corrupt[tier] += len(hashes)
        if tier == "array":
            for h in hashes:
                self.array_forget(h)
            self.events.removed(ev.ARRAY, hashes)

    # -- L1: room, install, demotion -----------------------------------------------------

    def _protected_or_busy(self, h: int) -> bool:
        return h in self._evicting or self.l1.pinned(h) or self.sessions.is_protected(h)

    def _busy(self, h: int) -> bool:
        return h in self._evicting or self.l1.pinned(h)

    async def reserve(self, n: int) -> list[int]:
        """Up to `n` free L1 slots, demoting victims as needed (fewer only if all are busy).

        Demotion runs shielded: a caller cancelled meanwhile (a prefetch past its deadline)
        does not cut a write-down in half; its victims stay marked until it is done."""
        slots: list[int] = []
        try:
            async with self._room:
                self.expire_sessions()
                while len(slots) < n:
                    slot = self.l1.reserve()
                    if slot is not None:
                        slots.append(slot)
                        continue
                    self._cap_protection()
                    victims = self._pick_victims(n - len(slots))
                    if not victims:
                        break
                    await asyncio.shield(self._demote(victims))
        except BaseException:
            for s in slots:
                self.l1.release(s)
            raise
        return slots

    def _cap_protection(self) -> None:
        """Protected slices may hold at most `protect_fraction` of L1 (counted among the
        slices actually in L1); past that, the least recently active sessions yield."""
        cap = int(self.settings.protect_fraction * self.l1.slots)
        while self.sessions.count_protected(self.l1.__contains__) > cap:
            if not self.sessions.shed_oldest():
                return

    def _pick_victims(self, need: int) -> list[int]:
        """LRU-K victims not protected; if only protected ones are left, protection yields,
        least recently active session first."""
        want = max(need, min(DEMOTE_BATCH, self.l1.slots // 64))
        victims = self.l1_order.victims(want, skip=self._protected_or_busy)
        if victims:
            return victims
        unprotected = self.l1_order.victims(want, skip=self._busy)
        if not unprotected:
            return []
        while not victims and self.sessions.shed_oldest():
            victims = self.l1_order.victims(want, skip=self._protected_or_busy)
        return victims or unprotected

    def expire_sessions(self) -> None:
        """End the protection of idle dialogues, handing each one's slices to
        `on_session_idle` (the snapshotter writes them as one cold object)."""
        for _, hashes in self.sessions.expire():
            if self.on_session_idle is not None:
                self.on_session_idle(hashes)

    async def install(
        self, items: Sequence[tuple[SliceMeta, Payload]], *, sticky: bool
    ) -> list[int]:
        """Copy slices into L1 (those not there yet); returns the hashes now in L1."""
        todo = [(m, p) for m, p in items if m.hash not in self.l1]
        slots = await self.reserve(len(todo)) if todo else []
        placed = todo[: len(slots)]
        try:
            await self.l1.write(slots, [p for _, p in placed])
        except BaseException:
            for s in slots:
                self.l1.release(s)
            raise
        for slot, (meta, _) in zip(slots, placed, strict=True):
            fresh = meta.hash not in self.l1
            self.l1.commit(meta.hash, slot, meta, sticky)
            self.l1_order.update(meta.hash)
            if fresh:
                self.events.stored(ev.GPU, [meta.hash], meta.parent, meta.tokens)
        return [m.hash for m, _ in items if m.hash in self.l1]

    def _gate(self, h: int, sticky: bool) -> bool:
        return sticky or self.history.count(h) >= 2

    async def _demote(self, victims: list[int]) -> None:
        """Write gated victims down to the array, then free them from L1."""
        self._evicting.update(victims)
        try:
            payloads = await self.l1.read(victims)
            if payloads is None:  # something vanished meanwhile: take what is still there
                victims = [h for h in victims if h in self.l1]
                payloads = await self.l1.read(victims) or []
            down: list[tuple[SliceMeta, bytes]] = []
            for h, p in zip(victims, payloads, strict=True):
                entry = self.l1.entry(h)
                if entry is None or h in self.array_index:
                    continue
                if self._gate(h, entry.sticky):
                    down.append((entry.meta, p))
                else:
                    self.counters.gated += 1
            try:
                ok = await asyncio.to_thread(self.array.write, down) if down else []
            except OSError as exc:  # the array's directory could not even be made (ENOSPC)
                log.warning("array write failed: %s", exc)
                ok = [False] * len(down)
            for (meta, _), written in zip(down, ok, strict=True):
                if written:
                    self.array_add(meta.hash, meta)
                    self.counters.demotions["l1_to_array"] += 1
                    self.counters.bytes_moved["l1_to_array"] += meta.length
                    self.events.stored(ev.ARRAY, [meta.hash], meta.parent, meta.tokens)
                else:
                    self.counters.write_failures += 1
            self.drops.note(ok.count(False), self.clock(), self.counters.write_failures)
            freed: list[int] = []
            for h in victims:
                if self.l1.free(h) is not None:
                    self.l1_order.remove(h)
                    freed.append(h)
            self.counters.evictions["l1"] += len(freed)
            self.events.removed(ev.GPU, freed)
            if freed and self.on_l1_evicted is not None:
                self.on_l1_evicted(freed)
        finally:
            self._evicting.difference_update(victims)
        if down and self.on_array_grew is not None:
            self.on_array_grew()

    async def evict_l1(self, hashes: list[int] | None) -> int:
        """Demote these slices (all of L1 if None) now: written down if gated, then freed."""
        async with self._room:
            todo = [h for h in (self.l1.hashes() if hashes is None else hashes) if h in self.l1]
            before = len(self.l1)
            for i in range(0, len(todo), DEMOTE_BATCH * 4):
                await self._demote(todo[i : i + DEMOTE_BATCH * 4])
            return before - len(self.l1)

    # -- data plane ----------------------------------------------------------------------

    async def put(
        self,
        h: int,
        data: bytes,
        *,
        parent: int | None = None,
        tokens: int | None = None,
        session: str | None = None,
    ) -> bool:
        """Store a slice in L1; False if it was already there."""
        if len(data) > self.settings.slice_bytes:
            raise SliceTooLargeError(
                f"slice of {len(data)} bytes exceeds the slot size {self.settings.slice_bytes}"
            )
        self.history.touch(h)
        if session:
            self.sessions.add(session, [h])
        entry = self.l1.entry(h)
        if entry is not None:
            entry.sticky = entry.sticky or session is not None
            self.l1_order.update(h)
            return False
        meta = await asyncio.to_thread(make_meta, h, data, parent, tokens)
        placed = await self.install([(meta, data)], sticky=session is not None)
        if h not in placed:
            raise BufferError("L1 has no free slot: every slice is being read or evicted")
        self.counters.bytes_moved["put"] += len(data)
        return True

    # -- control plane -------------------------------------------------------------------

    async def discover(self, hashes: list[int]) -> None:
        """Learn about array files written by peers sharing the directory: from the first
        hash known nowhere, stat the unknown ones until one is missing (a prefix ends there)."""
        start = next((i for i, h in enumerate(hashes) if self.where(h) is None), None)
        if start is None:
            return
        tail = hashes[start:]
        known = [self.where(h) is not None for h in tail]
        found = await asyncio.to_thread(probe_array, self.array, tail, known)
        for h in found:
            if h not in self.array_index:
                self.array_add(h, None)

    def where(self, h: int) -> str | None:
        if h in self.l1:
            return ev.GPU
        if h in self.array_index:
            return ev.ARRAY
        if h in self.snap_index:
            return ev.SNAPSHOT
        return None

    async def lookup(self, hashes: list[int]) -> dict[str, Any]:
        """How much of a chain is where: the leading available run and its split by tier."""
        await self.discover(hashes)
        return chain_summary(
            hashes,
            self.where,
            {
                ev.GPU: lambda h: h in self.l1,
                ev.ARRAY: lambda h: h in self.array_index,
                ev.SNAPSHOT: lambda h: h in self.snap_index,
            },
        )
