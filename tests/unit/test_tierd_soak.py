"""A concurrent soak of one store: writers, readers, prefetchers with tight deadlines,
snapshots, evictions and trimming all at once on tiny tiers. Whatever interleaving happens,
nothing raises, every served slice verifies, and the slot accounting adds up."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from tierd import events as ev
from tierd.daemon import Daemon
from tierd.settings import TierdSettings


def data_of(h: int) -> bytes:
    return random.Random(h).randbytes(500 + h % 1500)


async def test_concurrent_soak_keeps_every_invariant(tmp_path: Path) -> None:
    d = Daemon(
        TierdSettings(
            array_dir=tmp_path / "a",
            snapshot_dir=tmp_path / "s",
            l1_bytes=32 * 2048,
            slice_bytes=2048,
            array_gbps=0.005,
            snapshot_gbps=0.01,
            array_bytes=100_000,
            snapshot_bytes=150_000,
        )
    )
    await d.start()
    await d.wait_ready()
    served: list[bool] = []

    def chain_at(base: int, n: int = 8) -> list[int]:
        return [base + j for j in range(n)]

    async def writer(rng: random.Random) -> None:
        for _ in range(40):
            base = rng.randrange(1, 100) * 10
            parent = None
            for h in chain_at(base, rng.randrange(1, 8)):
                session = f"p{base}" if rng.random() < 0.5 else None
                await d.store.put(h, data_of(h), parent=parent, tokens=16, session=session)
                parent = h

    async def reader(rng: random.Random) -> None:
        for _ in range(120):
            h = rng.randrange(1, 100) * 10 + rng.randrange(0, 8)
            got = await d.loader.get(h)
            if got is not None:
                served.append(got == data_of(h))

    async def prefetcher(rng: random.Random) -> None:
        for _ in range(40):
            base = rng.randrange(1, 100) * 10
            deadline = rng.choice([0.0, 0.001, 0.05])
            out = await d.prefetcher.prefetch(chain_at(base), deadline, session=f"p{base}")
            assert sum(out[k] for k in ("hit", "on_time", "late", "abandoned", "miss")) == 8

    async def admin(rng: random.Random) -> None:
        for _ in range(40):
            chain = chain_at(rng.randrange(1, 100) * 10)
            r = rng.random()
            if r < 0.4:
                await d.snapshotter.snapshot(chain)
            elif r < 0.6:
                await d.evict(chain, ev.GPU)
            elif r < 0.7:
                await d.evict(chain[:1], ev.ARRAY)
            else:
                await d.store.lookup(chain)

    try:
        workers = [writer(random.Random(i)) for i in range(4)]
        workers += [reader(random.Random(10 + i)) for i in range(4)]
        workers += [prefetcher(random.Random(20 + i)) for i in range(2)]
        workers += [admin(random.Random(30 + i)) for i in range(2)]
        await asyncio.gather(*workers)
        await d.snapshotter.drain()
        st = d.store
        assert served and all(served)
        assert len(st.l1) + st.l1.free_slots == st.l1.slots
        assert d.loader.in_flight == 0
        assert st.array_bytes <= st.settings.array_bytes + 8 * 2048
        assert st.snapshot_bytes <= st.settings.snapshot_bytes or len(st.snapshots) == 1
        assert sum(st.counters.corrupt.values()) == 0 and st.counters.write_failures == 0
        for h in [*st.array_index, *st.snap_index]:
            got = await d.loader.get(h)
            assert got is None or got == data_of(h)
    finally:
        await d.close()
