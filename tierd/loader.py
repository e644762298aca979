"""Loads into L1 from the array and from snapshots, single-flight.

Every slice being loaded maps to one `Transfer` (a task moving a batch of slices:
up to `ARRAY_BATCH` array files read in parallel by the native `read_batch`, or one whole
snapshot object). A caller that wants a slice already in flight joins that transfer instead
of starting another. Callers count as waiters; a waiter that gives up (a prefetch past its
deadline) releases its claim, and a transfer nobody waits for any more is cancelled. The
emulated link time (`tierd.emulation`) is charged inside the transfer, so cancelling it
at a deadline stops the charge too. A slice that fails verification is quarantined,
counted, announced as removed, and looked for in the snapshots instead; it is never served.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable

from contracts.tiers import TIERD_ARRAY, TIERD_LEVEL_BY_NAME, Tier
from tierd.slices import CorruptSliceError, Payload, SliceMeta
from tierd.store import TieredStore

ARRAY_BATCH = 32

Loaded = dict[int, Payload]


class Transfer:
    """One in-flight load of some slices into L1."""

    def __init__(self, hashes: list[int]) -> None:
        self.hashes = hashes
        self.waiters = 0
        self.task: asyncio.Task[Loaded] | None = None

    def done(self) -> bool:
        return self.task is not None and self.task.done()


class Loader:
    """Single-flight loads of slices into L1 (and the data-plane `get`)."""

    def __init__(self, store: TieredStore) -> None:
        self.store = store
        self._flights: dict[int, Transfer] = {}

    @property
    def in_flight(self) -> int:
        return len(self._flights)

    async def close(self) -> None:
        """Cancel every transfer still in flight and wait for them to end."""
        tasks = {t.task for t in self._flights.values() if t.task is not None}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._flights.clear()

    async def plan(self, hashes: list[int]) -> tuple[list[Transfer], list[int]]:
        """Join or start the transfers that bring `hashes` into L1 (one waiter each);
        also return the hashes found in no tier."""
        st = self.store
        await st.discover(hashes)
        joined: dict[int, Transfer] = {}
        from_array: list[int] = []
        from_snap: dict[str, list[int]] = {}
        missing: list[int] = []
        for h in hashes:
            if h in st.l1:
                continue
            t = self._flights.get(h)
            if t is not None:
                joined[id(t)] = t
            elif h in st.array_index:
                from_array.append(h)
            elif h in st.snap_index:
                from_snap.setdefault(st.snap_index[h], []).append(h)
            else:
                missing.append(h)
        for i in range(0, len(from_array), ARRAY_BATCH):
            t = self._start(from_array[i : i + ARRAY_BATCH], self._load_array)
            joined[id(t)] = t
        for sid, hs in from_snap.items():
            t = self._start(hs, functools.partial(self._load_snapshot, sid))
            joined[id(t)] = t
        for t in joined.values():
            t.waiters += 1
        return list(joined.values()), missing

    def _start(self, hashes: list[int], fn: Callable[[list[int]], Awaitable[Loaded]]) -> Transfer:
        t = Transfer(hashes)
        for h in hashes:
            self._flights[h] = t

        async def run() -> Loaded:
            try:
                return await fn(hashes)
            finally:
                for h in hashes:
                    if self._flights.get(h) is t:
                        del self._flights[h]

        t.task = asyncio.create_task(run(), name=f"tierd-load-{len(hashes)}")
        t.task.add_done_callback(_retrieve)
        return t

    async def wait(self, t: Transfer) -> Loaded:
        assert t.task is not None
        return await asyncio.shield(t.task)

    def release(self, t: Transfer) -> bool:
        """Drop one waiter's claim; True if that cancelled the transfer."""
        t.waiters -= 1
        if t.waiters <= 0 and t.task is not None and not t.task.done():
            t.task.cancel()
            for h in t.hashes:
                if self._flights.get(h) is t:
                    del self._flights[h]
            return True
        return False

    async def get(self, h: int) -> bytes | None:
        """A slice's bytes from the fastest tier holding it (promoting it to L1), or None."""
        st = self.store
        st.history.touch(h)
        if h in st.l1:
            copied = await st.l1.read([h])
            if copied is not None:
                st.l1_order.update(h)
                st.counters.hits["l1"] += 1
                st.counters.bytes_moved["get"] += len(copied[0])
                return copied[0]
        await st.discover([h])
        source = st.where(h)
        transfers, _ = await self.plan([h])
        data: bytes | None = None
        for t in transfers:
            try:
                got = (await self.wait(t)).get(h)
                if got is not None:
                    data = bytes(got)
            finally:
                self.release(t)
        if data is None:
            st.counters.hits["miss"] += 1
            return None
        level = TIERD_LEVEL_BY_NAME.get(source or "", TIERD_ARRAY)
        st.counters.hits[level.key] += 1
        st.counters.bytes_moved["get"] += len(data)
        return data

    async def _load_array(self, hashes: list[int]) -> Loaded:
        st = self.store
        t0 = time.monotonic()
        results = await asyncio.to_thread(st.array.read, hashes)
        good: list[tuple[SliceMeta, Payload]] = []
        bad: list[int] = []
        corrupt: list[int] = []
        for r in results:
            if r.meta is not None and r.payload is not None:
                good.append((r.meta, r.payload))
            else:
                bad.append(r.hash)
                if r.corrupt is not None:
                    corrupt.append(r.hash)
                else:
                    st.array_forget(r.hash)  # a peer removed it
        if corrupt:
            st.note_corrupt("array", corrupt)
        charged = sum(st.emulator.charged_bytes(m.length, m.tokens) for m, _ in good)
        await st.emulator.array.transfer(charged)
        st.meters[Tier.ARRAY.label].record(charged, t0, time.monotonic())
        st.counters.bytes_moved["array_to_l1"] += sum(m.length for m, _ in good)
        for m, _ in good:
            st.array_add(m.hash, m)
        await st.install(good, sticky=False)
        out: Loaded = {m.hash: p for m, p in good}
        by_snap: dict[str, list[int]] = {}
        for h in bad:
            if h in st.snap_index:
                by_snap.setdefault(st.snap_index[h], []).append(h)
        for sid, hs in by_snap.items():
            out.update(await self._load_snapshot(sid, hs))
        return out

    async def _load_snapshot(self, sid: str, hashes: list[int]) -> Loaded:
        st = self.store
        t0 = time.monotonic()
        try:
            items = await asyncio.to_thread(st.snapshots_dir.load, sid)
        except FileNotFoundError:
            st.forget_snapshot(sid)
            return {}
        except CorruptSliceError:
            gone = st.forget_snapshot(sid)
            st.counters.corrupt["snapshot"] += len(gone)
            return {}
        st.touch_snapshot(sid)
        charged = sum(st.emulator.charged_bytes(m.length, m.tokens) for m, _ in items)
        await st.emulator.snapshot.transfer(charged)
        st.meters[Tier.SNAPSHOT.label].record(charged, t0, time.monotonic())
        st.counters.bytes_moved["snapshot_to_l1"] += sum(m.length for m, _ in items)
        wanted = set(hashes)
        first = [it for it in items if it[0].hash in wanted]
        rest = [it for it in items if it[0].hash not in wanted and it[0].hash not in st.l1]
        spare = max(0, st.l1.free_slots - len(first))
        await st.install(first + rest[:spare], sticky=False)
        return {m.hash: p for m, p in first}


def _retrieve(task: asyncio.Task[Loaded]) -> None:
    """Mark a finished transfer's exception as seen (waiters re-raise it themselves)."""
    if not task.cancelled():
        with contextlib.suppress(BaseException):
            task.exception()
