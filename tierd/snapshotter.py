"""L3 writes: a chain as one snapshot object, idle dialogues, trimming the array and L3.

`snapshot(hashes)` gathers the chain's slices from L1 (pinned copies) or the array
(verified reads), in chain order, and writes them as one zstd object plus manifest
(`tierd.tiers.l3_snapshots`), so a returning player's whole dialogue comes back with one
sequential read. It runs in the background (`schedule`) or awaited. A dialogue whose
session has been idle longer than `session_ttl_s` (the player is thinking or gone) is
snapshotted the same way when its protection ends (`snapshot_idle_sessions`). When the
snapshots outgrow `snapshot_bytes` (> 0), whole objects are deleted in LRU-K order (loads
and writes count as touches), never the one just written.

When the array has a capacity of its own (`array_bytes` > 0; leave it 0 on a directory
shared by several tierds) and grows past it, `trim` evicts array slices in LRU-K order.
Demotion writes down before it frees: victims that pass the frequency gate (touched at
least twice) are first written together as one snapshot object, then their files are
deleted; the others are just deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from tierd import events as ev
from tierd.slices import Payload, SliceMeta
from tierd.store import TieredStore

TRIM_BATCH = 256


def snapshot_id(hashes: list[int]) -> str:
    return f"{hashes[0]:016x}-{hashes[-1]:016x}-{len(hashes)}"


class Snapshotter:
    """Background snapshot writes and array trimming for one store."""

    def __init__(self, store: TieredStore) -> None:
        self.store = store
        self._tasks: set[asyncio.Task[Any]] = set()
        self._trim: asyncio.Task[None] | None = None
        self._trim_again = False
        store.on_array_grew = self.request_trim
        if store.settings.snapshot_idle_sessions:
            store.on_session_idle = self.snapshot_idle

    async def close(self) -> None:
        for t in [*self._tasks, *([self._trim] if self._trim else [])]:
            t.cancel()
        for t in [*self._tasks, *([self._trim] if self._trim else [])]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    async def drain(self) -> None:
        """Wait for the snapshots scheduled so far and for the array trim they may cause."""
        while self._tasks or (self._trim is not None and not self._trim.done()):
            pending = [*self._tasks, *([self._trim] if self._trim else [])]
            await asyncio.gather(*pending, return_exceptions=True)

    async def gather(self, hashes: list[int]) -> list[tuple[SliceMeta, Payload]]:
        """The chain's slices that L1 or the array can give, verified, in chain order."""
        st = self.store
        await st.discover(hashes)  # slices a peer wrote to the shared array count too
        got: dict[int, tuple[SliceMeta, Payload]] = {}
        in_l1 = [h for h in hashes if h in st.l1]
        for h in in_l1:
            entry = st.l1.entry(h)
            data = await st.l1.read([h])
            if entry is not None and data is not None:
                got[h] = (entry.meta, data[0])
        from_array = [h for h in hashes if h not in got and h in st.array_index]
        if from_array:
            results = await asyncio.to_thread(st.array.read, from_array)
            corrupt = [r.hash for r in results if r.corrupt is not None]
            if corrupt:
                st.note_corrupt("array", corrupt)
            for r in results:
                if r.meta is not None and r.payload is not None:
                    got[r.hash] = (r.meta, r.payload)
        return [got[h] for h in hashes if h in got]

    async def snapshot(self, hashes: list[int]) -> dict[str, Any]:
        st = self.store
        hashes = list(dict.fromkeys(hashes))  # a chain names each slice once
        items = await self.gather(hashes)
        if not items:
            return {"id": None, "slices": 0, "missing": len(hashes), "object_bytes": 0}
        sid = snapshot_id([m.hash for m, _ in items])
        if sid in st.snapshots:
            snap = st.snapshots[sid]
        else:
            snap = await asyncio.to_thread(st.snapshots_dir.write, sid, items)
            st.add_snapshot(snap)
            st.counters.snapshots_written += 1
            st.counters.bytes_moved["to_snapshot"] += snap.raw_bytes
            await self.trim_snapshots()
        return {
            "id": sid,
            "slices": len(items),
            "missing": len(hashes) - len(items),
            "object_bytes": snap.object_bytes,
        }

    def schedule(self, hashes: list[int]) -> str | None:
        """Snapshot in the background; returns the id it will have (None if empty)."""
        if not hashes:
            return None
        task = asyncio.create_task(self.snapshot(hashes), name="tierd-snapshot")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return snapshot_id(hashes)

    def snapshot_idle(self, hashes: list[int]) -> None:
        """A dialogue went idle: keep its last turns as one cold object."""
        if hashes and self.schedule(hashes) is not None:
            self.store.counters.idle_snapshots += 1

    async def trim_snapshots(self) -> None:
        """Over the snapshot capacity: delete whole objects in LRU-K order."""
        st = self.store
        cap = st.settings.snapshot_bytes
        while cap and st.snapshot_bytes > cap and len(st.snap_order) > 1:
            victims = st.snap_order.victims(1)
            if not victims:
                return
            sid = st.snap_ids[victims[0]]
            await asyncio.to_thread(st.snapshots_dir.delete, sid)
            st.counters.evictions["snapshot"] += len(st.forget_snapshot(sid))

    def request_trim(self) -> None:
        st = self.store
        cap = st.settings.array_bytes
        if not cap or st.array_bytes <= cap:
            return
        if self._trim is not None and not self._trim.done():
            self._trim_again = True
            return
        self._trim = asyncio.create_task(self.trim(), name="tierd-trim")

    async def trim(self) -> None:
        st = self.store
        cap = st.settings.array_bytes
        while True:
            self._trim_again = False
            while cap and st.array_bytes > cap and len(st.array_order):
                victims = st.array_order.victims(TRIM_BATCH)
                if not victims:
                    break
                keep = [h for h in victims if st.history.count(h) >= 2 and h not in st.snap_index]
                if keep:
                    await self.snapshot(keep)
                    st.counters.demotions["array_to_snapshot"] += len(keep)
                for h in victims:
                    await asyncio.to_thread(st.array.delete, h)
                    st.array_forget(h)
                st.counters.evictions["array"] += len(victims)
                st.events.removed(ev.ARRAY, victims)
            if not self._trim_again:
                return
