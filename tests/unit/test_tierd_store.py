"""The tiered store in-process on real files: gate, protection, corruption, prefetch
deadlines, single-flight loads, snapshots and restart recovery."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from tierd import events as ev
from tierd.daemon import Daemon
from tierd.prefetch import ChainPrefetcher
from tierd.residency import EngineResidency
from tierd.settings import TierdSettings
from tierd.tiers.l2_array import TEMP_PREFIX

SLOT = 4096


def make_settings(tmp_path: Path, **kw: Any) -> TierdSettings:
    base: dict[str, Any] = {
        "array_dir": tmp_path / "array",
        "snapshot_dir": tmp_path / "snap",
        "l1_bytes": 8 * SLOT,
        "slice_bytes": SLOT,
        "instance_id": "t",
        "temp_grace_s": 0.0,
    }
    base.update(kw)
    return TierdSettings(**base)


def data_of(h: int, n: int = 1000) -> bytes:
    return random.Random(h).randbytes(n)


@asynccontextmanager
async def running(settings: TierdSettings) -> AsyncIterator[Daemon]:
    d = Daemon(settings)
    await d.start()
    await d.wait_ready()
    try:
        yield d
    finally:
        await d.close()


async def put_chain(d: Daemon, hashes: list[int], session: str | None = "p") -> None:
    parent = None
    for h in hashes:
        await d.store.put(h, data_of(h), parent=parent, tokens=16, session=session)
        parent = h


async def test_frequency_gate_writes_down_only_repeat_or_session_slices(tmp_path: Path) -> None:
    async with running(make_settings(tmp_path)) as d:
        await d.store.put(1, data_of(1))  # one touch, no session: dropped on eviction
        await d.store.put(2, data_of(2))
        assert await d.loader.get(2) == data_of(2)  # second touch: written down
        await d.store.put(3, data_of(3), session="p")  # session slice: written down
        assert await d.evict([1, 2, 3], ev.GPU) == 3
        assert d.store.where(1) is None
        assert d.store.where(2) == ev.ARRAY and d.store.where(3) == ev.ARRAY
        assert d.store.counters.gated == 1
        assert await d.loader.get(1) is None
        assert await d.loader.get(3) == data_of(3)
        assert d.store.counters.hits["array"] == 1 and d.store.counters.hits["miss"] == 1


async def test_demotion_under_pressure_keeps_protected_dialogue_in_l1(tmp_path: Path) -> None:
    async with running(make_settings(tmp_path)) as d:
        await put_chain(d, [1, 2], session=None)
        await d.prefetcher.prefetch([1, 2], 1.0, session="player")  # opens a turn: protects
        for h in range(100, 130):  # touched twice each: LRU-K alone would keep these
            await d.store.put(h, data_of(h))
            assert await d.loader.get(h) == data_of(h)
        assert 1 in d.store.l1 and 2 in d.store.l1
        assert d.store.counters.evictions["l1"] >= 30 - 6
        # every demoted slice of the other session was written before it was freed
        demoted = [h for h in range(100, 130) if h not in d.store.l1]
        assert all(d.store.array.exists(h) for h in demoted)
        assert d.store.counters.demotions["l1_to_array"] == len(demoted)


async def test_corrupt_array_slice_is_quarantined_reported_and_never_served(
    tmp_path: Path, redis_url: str
) -> None:
    import msgpack
    import redis.asyncio as aioredis

    from contracts.redis_keys import stream_key

    pool = f"t{random.getrandbits(48):x}"
    async with running(make_settings(tmp_path, redis_url=redis_url, pool=pool)) as d:
        await put_chain(d, [11, 12])
        await d.evict(None, ev.GPU)
        path = d.store.array.path(11)
        raw = bytearray(path.read_bytes())
        raw[-1] ^= 0xFF
        path.write_bytes(bytes(raw))
        assert await d.loader.get(11) is None
        assert not path.exists()
        assert len(list(d.store.array.quarantine_dir.iterdir())) == 1
        assert d.store.counters.corrupt["array"] == 1
        assert (await d.store.lookup([11, 12]))["available"] == 0
        assert await d.loader.get(12) == data_of(12)
        await d.events.flush()
    r = aioredis.Redis.from_url(redis_url)
    try:
        entries = await r.xrange(stream_key(pool))
        await r.delete(stream_key(pool))
    finally:
        await r.aclose()
    removed = [
        e
        for _, fields in entries
        for e in msgpack.unpackb(fields[b"batch"])[1]
        if e[0] == "BlockRemoved" and e[2] == "ARRAY"
    ]
    assert [11] in [e[1] for e in removed]


async def test_prefetch_past_deadline_is_abandoned_not_waited_for(tmp_path: Path) -> None:
    chain = [21, 22, 23, 24]
    # 1000-byte slices over a 2 kB/s emulated array link: 2 s of transfer for the chain
    async with running(make_settings(tmp_path, array_gbps=2e-6)) as d:
        await put_chain(d, chain)
        await d.evict(None, ev.GPU)
        out = await d.prefetcher.prefetch(chain, 0.05)
        assert out["abandoned"] == 4 and out["on_time"] == 0
        assert d.store.counters.prefetch["abandoned"] == 4
        assert d.loader.in_flight == 0  # cancelled, nobody else wanted them
        assert not any(h in d.store.l1 for h in chain)
    # the same chain from the same shared array without the slow link arrives on time
    async with running(make_settings(tmp_path, instance_id="fast")) as d2:
        out = await d2.prefetcher.prefetch(chain, 5.0)
        assert out["on_time"] == 4 and out["abandoned"] == 0
        assert all(h in d2.store.l1 for h in chain)


async def test_a_prefetch_passes_over_the_blocks_the_engine_holds(tmp_path: Path) -> None:
    chain = [31, 32, 33, 34, 35, 36]
    async with running(make_settings(tmp_path)) as d:
        await put_chain(d, chain)
        await d.evict(None, ev.GPU)  # all six in the array only
        residency = EngineResidency()
        residency.stored([31, 32, 33, 35])  # 35 is past the engine's prefix: it asks for it
        prefetcher = ChainPrefetcher(d.store, d.loader, d.hints, residency)
        out = await prefetcher.prefetch(chain, 5.0)
        assert (out["on_engine"], out["on_time"]) == (3, 3)
        assert [h in d.store.l1 for h in chain] == [False] * 3 + [True] * 3
        residency.removed([32])  # evicted by the engine: from there on it would ask
        assert residency.held_prefix(chain) == 1
        residency.cleared()
        assert len(residency) == 0


async def test_concurrent_gets_of_one_slice_share_one_transfer(tmp_path: Path) -> None:
    # 1000 bytes over a 2 kB/s link: the first transfer lasts 0.5 s, the others join it
    async with running(make_settings(tmp_path, array_gbps=2e-6)) as d:
        await put_chain(d, [31])
        await d.evict(None, ev.GPU)
        got = await asyncio.gather(*(d.loader.get(31) for _ in range(5)))
        assert got == [data_of(31)] * 5
        assert d.store.counters.bytes_moved["array_to_l1"] == 1000


async def test_snapshot_brings_a_whole_chain_back_with_one_read(tmp_path: Path) -> None:
    chain = [41, 42, 43, 44, 45, 46]
    async with running(make_settings(tmp_path)) as d:
        await put_chain(d, chain)
        out = await d.snapshotter.snapshot([*chain, chain[0]])  # a repeat is stored once
        assert out["slices"] == 6 and out["missing"] == 0
        await d.evict(None, ev.GPU)
        await d.evict(None, ev.ARRAY)
        where = await d.store.lookup(chain)
        assert where["tiers"] == [ev.SNAPSHOT] * 6 and where["leading"][ev.GPU] == 0
        assert await d.loader.get(43) == data_of(43)
        assert (await d.store.lookup(chain))["tiers"] == [ev.GPU] * 6
        assert d.store.counters.hits["snapshot"] == 1
        # a damaged snapshot object is quarantined and serves nothing
        await d.evict(None, ev.GPU)
        obj = tmp_path / "snap" / f"{out['id']}.zst"
        raw = bytearray(obj.read_bytes())
        raw[len(raw) // 2] ^= 0x55
        obj.write_bytes(bytes(raw))
        assert await d.loader.get(44) is None
        assert d.store.counters.corrupt["snapshot"] == 6
        assert (await d.store.lookup(chain))["available"] == 0


async def test_restart_rebuilds_indexes_and_never_serves_torn_files(tmp_path: Path) -> None:
    chain = list(range(51, 61))
    async with running(make_settings(tmp_path)) as d:
        await put_chain(d, chain)
        await d.snapshotter.snapshot(chain[:3])
        await d.evict(None, ev.GPU)
    array = tmp_path / "array"
    torn = next(array.glob("*/*.slice"))
    victim = int(torn.stem, 16)
    torn.write_bytes(torn.read_bytes()[:-10])  # size no longer matches its header
    (torn.parent / f"{TEMP_PREFIX}{victim:016x}-1-1").write_bytes(b"half a slice")
    async with running(make_settings(tmp_path)) as d:
        assert d.store.counters.recovered["array"] == 9
        assert d.store.counters.recovered["snapshot"] == 3
        assert d.store.counters.corrupt["array"] == 1
        assert not list(array.glob(f"*/{TEMP_PREFIX}*"))
        for h in chain:
            got = await d.loader.get(h)
            if h == victim and victim not in chain[:3]:
                assert got is None
            else:
                assert got == data_of(h)


async def test_idle_dialogue_is_snapshotted_when_its_protection_ends(tmp_path: Path) -> None:
    now = [0.0]
    d = Daemon(make_settings(tmp_path, session_ttl_s=60.0), clock=lambda: now[0])
    await d.start()
    try:
        await d.wait_ready()
        chain = [61, 62, 63]
        await put_chain(d, chain, session=None)
        await d.prefetcher.prefetch(chain, 1.0, session="player-9")
        assert all(d.store.sessions.is_protected(h) for h in chain)
        now[0] = 30.0
        d.store.expire_sessions()
        assert d.store.counters.idle_snapshots == 0
        now[0] = 61.0
        d.store.expire_sessions()
        await d.snapshotter.drain()
        assert not any(d.store.sessions.is_protected(h) for h in chain)
        assert d.store.counters.idle_snapshots == 1
        assert [d.store.snap_index.get(h) for h in chain] == [d.store.snap_index[61]] * 3
    finally:
        await d.close()


async def test_snapshot_capacity_evicts_whole_objects_in_lru_k_order(tmp_path: Path) -> None:
    a, b, c = [71, 72, 73], [81, 82, 83], [91, 92, 93]
    async with running(make_settings(tmp_path, l1_bytes=16 * SLOT)) as d:
        for chain in (a, b, c):
            await put_chain(d, chain)
        one = (await d.snapshotter.snapshot(a))["object_bytes"]
        d.store.settings.snapshot_bytes = int(2.5 * one)
        await d.snapshotter.snapshot(b)
        await d.evict(a, ev.GPU)
        await d.evict(a, ev.ARRAY)
        assert await d.loader.get(71) == data_of(71)  # a second touch of snapshot a
        await d.snapshotter.snapshot(c)  # over capacity: b (touched once, oldest) goes
        assert d.store.where(81) != ev.SNAPSHOT and 81 not in d.store.snap_index
        assert 71 in d.store.snap_index and 91 in d.store.snap_index
        assert d.store.counters.evictions["snapshot"] == 3
        assert d.store.snapshot_bytes <= d.store.settings.snapshot_bytes


def test_emulation_charges_the_real_model_size() -> None:
    from tierd.emulation import Emulator

    em = Emulator("llama3-8b-h100")
    assert em.charged_bytes(1000, 16) == 16 * 128 * 1024
    assert em.charged_bytes(1000, None) == 1000
    assert em.array.bytes_per_s == 10e9 and em.snapshot.bytes_per_s == 3e9
    fast = Emulator("qwen2.5-32b-h200", array_gbps=25.0)
    assert fast.array.bytes_per_s == 25e9
    assert Emulator(None).charged_bytes(1000, 16) == 1000


async def test_protection_yields_past_its_share_of_l1_oldest_session_first(
    tmp_path: Path,
) -> None:
    async with running(make_settings(tmp_path, protect_fraction=0.5)) as d:  # 8 slots, cap 4
        big = [201, 202, 203, 204, 205, 206]
        await put_chain(d, big, session=None)
        await d.prefetcher.prefetch(big, 1.0, session="big")
        await put_chain(d, [301], session=None)
        await d.prefetcher.prefetch([301], 1.0, session="small")
        for h in range(400, 410):
            await d.store.put(h, data_of(h))
            assert await d.loader.get(h) == data_of(h)
        assert 301 in d.store.l1  # the recent dialogue keeps its protection
        assert not any(h in d.store.l1 for h in big)  # the big, older one yielded
        assert not d.store.sessions.is_protected(201)


async def test_cancelled_emulated_transfer_hands_its_link_time_back() -> None:
    from tierd.emulation import Link

    link = Link(1000.0)  # 1 kB/s
    task = asyncio.create_task(link.transfer(1_000_000))  # would hold the link 1000 s
    await asyncio.sleep(0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert link.busy_until <= time.monotonic()  # the next transfer is not queued behind it


async def test_deadline_passing_on_a_shared_transfer_counts_late_and_keeps_it(
    tmp_path: Path,
) -> None:
    # 1000 bytes over a 2 kB/s link: 0.5 s; another waiter (a get) holds the transfer
    async with running(make_settings(tmp_path, array_gbps=2e-6)) as d:
        await put_chain(d, [501])
        await d.evict(None, ev.GPU)
        transfers, missing = await d.loader.plan([501])  # the other waiter
        assert len(transfers) == 1 and missing == []
        out = await d.prefetcher.prefetch([501], 0.01)
        assert out["late"] == 1 and out["abandoned"] == 0
        try:
            loaded = await d.loader.wait(transfers[0])
        finally:
            d.loader.release(transfers[0])
        assert loaded[501] == data_of(501) and 501 in d.store.l1
        assert d.store.counters.prefetch["late"] == 1
