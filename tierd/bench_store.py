"""The store half of `tierd bench`: how fast a dialogue's KV chain comes back into L1.

One chain of `chain_slices` slices is put (with a session key, so it passes the frequency
gate), snapshotted as one object, and demoted to the array. Then, page cache dropped before
each run, best of `repeat`:
- ``chain_prefetch_gbps``: one prefetch of the whole chain from the array (batched parallel
  reads of 32 files per transfer, transfers overlapping);
- ``chain_sequential_gbps``: the same slices fetched one `get` after another (what an engine
  asking slice by slice would see);
- ``chain_snapshot_gbps``: the chain from its snapshot object alone (array copies deleted):
  one sequential read plus zstd decompression and verification of every slice.
Payloads are random bytes (incompressible: the snapshot figure is a floor, real KV
compresses somewhat). No emulated link time is charged: these are the real bytes moving.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import tierd.native as native
from contracts.errors import UpstreamError
from tierd import events as ev
from tierd.daemon import Daemon
from tierd.settings import TierdSettings


class ChainIncompleteError(UpstreamError, RuntimeError):
    """The daemon under the benchmark did not bring the whole chain back into L1."""


async def measure_chain(
    chain_slices: int, slice_bytes: int, directory: Path, repeat: int
) -> dict[str, Any]:
    settings = TierdSettings(
        array_dir=directory / "array",
        snapshot_dir=directory / "snap",
        l1_bytes=(chain_slices + 8) * slice_bytes,
        slice_bytes=slice_bytes,
        instance_id="bench",
        l1_backend="host",
    )
    d = Daemon(settings)
    await d.start()
    try:
        await d.wait_ready()
        chain = list(range(1, chain_slices + 1))
        parent = None
        for h in chain:
            await d.store.put(h, os.urandom(slice_bytes), parent=parent, session="bench")
            parent = h
        snap = await d.snapshotter.snapshot(chain)
        await d.evict(None, ev.GPU)
        files = [str(d.store.array.path(h)) for h in chain]
        total = chain_slices * slice_bytes

        async def cold(files_to_drop: list[str]) -> None:
            await d.evict(None, ev.GPU)
            await asyncio.to_thread(native.drop_page_cache, files_to_drop)

        async def prefetch() -> None:
            out = await d.prefetcher.prefetch(chain, 600.0)
            if out["on_time"] != chain_slices:
                raise ChainIncompleteError(f"prefetch brought {out} of {chain_slices}")

        async def sequential() -> None:
            for h in chain:
                if await d.loader.get(h) is None:
                    raise ChainIncompleteError(f"slice {h} missing")

        best: dict[str, float] = {}
        for _ in range(repeat):
            for name, fn in (("prefetch", prefetch), ("sequential", sequential)):
                await cold(files)
                t0 = time.perf_counter()
                await fn()
                best[name] = min(best.get(name, float("inf")), time.perf_counter() - t0)
        await d.evict(None, ev.ARRAY)
        snap_files = [str(settings.snapshot_dir / f"{snap['id']}.zst")]
        for _ in range(repeat):
            await cold(snap_files)
            t0 = time.perf_counter()
            await prefetch()
            best["snapshot"] = min(best.get("snapshot", float("inf")), time.perf_counter() - t0)
        corrupt = sum(d.store.counters.corrupt.values())
    finally:
        await d.close()
    return {
        "chain_slices": chain_slices,
        "chain_bytes": total,
        "chain_prefetch_gbps": total / best["prefetch"] / 1e9,
        "chain_sequential_gbps": total / best["sequential"] / 1e9,
        "chain_prefetch_speedup": best["sequential"] / best["prefetch"],
        "chain_snapshot_gbps": total / best["snapshot"] / 1e9,
        "snapshot_object_bytes": snap["object_bytes"],
        "chain_corrupt_slices": corrupt,
    }
