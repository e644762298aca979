"""Crash test: `tierd serve` as a real process, killed with SIGKILL in the middle of heavy
demotion, restarted on the same directories. Every slice it then serves must verify, and at
least 99% of the slices fully written before the kill (renamed into the array directory)
must come back."""

from __future__ import annotations

import asyncio
import json
import random
import signal
from pathlib import Path

import httpx

from tests.support.procs import ManagedProcess, free_port, python_module
from tierd.client import TierdClient
from tierd.tiers.l2_array import SUFFIX

SLICE = 4096


def data_of(h: int) -> bytes:
    return random.Random(h).randbytes(3000 + h % 1000)


def start(tmp: Path, port: int, name: str) -> ManagedProcess:
    proc = ManagedProcess(
        python_module(
            "tierd.cli",
            "serve",
            "--port",
            str(port),
            "--l1-bytes",
            str(16 * SLICE),
            "--slice-bytes",
            str(SLICE),
            "--array-dir",
            str(tmp / "array"),
            "--snapshot-dir",
            str(tmp / "snap"),
            "--instance-id",
            name,
        ),
        tmp / f"{name}.log",
    )
    proc.wait_http(f"http://127.0.0.1:{port}/readyz", timeout_s=30)
    return proc


def array_files(root: Path) -> set[int]:
    return {int(p.name[: -len(SUFFIX)], 16) for p in root.glob(f"*/*{SUFFIX}")}


async def test_sigkill_mid_demotion_loses_nothing_written(tmp_path: Path) -> None:
    port = free_port()
    proc = start(tmp_path, port, "crash-1")
    acked: set[int] = set()
    stop = asyncio.Event()
    enough = asyncio.Event()
    try:
        async with TierdClient(f"http://127.0.0.1:{port}", timeout_s=5) as client:

            async def writer(first: int) -> None:
                h = first
                while not stop.is_set():
                    try:
                        await client.put_slice(h, data_of(h), parent=h - 4, tokens=16, session="s")
                    except httpx.HTTPError:
                        return  # the daemon is gone
                    acked.add(h)
                    if len(acked) >= 400:
                        enough.set()
                    h += 4

            async def snapshotter() -> None:
                # background snapshots of recent chains: objects and manifests being written
                # when the kill comes
                while not stop.is_set():
                    recent = sorted(h for h in acked if h % 4 == 0)[-8:]
                    if recent:
                        try:
                            await client.snapshot(recent)
                        except httpx.HTTPError:
                            return
                    await asyncio.sleep(0.02)

            writers = [asyncio.create_task(writer(1000 + i)) for i in range(4)]
            writers.append(asyncio.create_task(snapshotter()))
            await asyncio.wait_for(enough.wait(), 60)
            demoted_before = (await client.stats())["demotions"]["l1_to_array"]
            proc.kill(signal.SIGKILL)  # writers are still putting: demotion is mid-flight
            stop.set()
            await asyncio.gather(*writers)
    finally:
        proc.stop()

    written = array_files(tmp_path / "array")
    assert len(written) >= demoted_before > 0
    # damage one fully written slice after the crash: it must be refused, not served
    damaged = min(written)
    path = next((tmp_path / "array").glob(f"*/{damaged:016x}{SUFFIX}"))
    raw = bytearray(path.read_bytes())
    raw[-7] ^= 0x42
    path.write_bytes(bytes(raw))

    port2 = free_port()
    proc2 = start(tmp_path, port2, "crash-2")
    try:
        async with TierdClient(f"http://127.0.0.1:{port2}") as client:
            stats = await client.stats()
            indexed = 0
            for h in sorted(written - {damaged}):
                indexed += (await client.lookup([h]))["available"]
            served: dict[int, bool] = {}
            for h in sorted(acked | written):
                got = await client.get_slice(h)
                if got is not None:
                    served[h] = got == data_of(h)
            after = await client.stats()
            # a recovered snapshot serves on its own: drop one chain's other copies, load it
            manifests = sorted((tmp_path / "snap").glob("*.json"))
            snap_chain: list[int] = []
            if manifests:
                entries = json.loads(manifests[-1].read_text())["entries"]
                snap_chain = [int(e["hash"]) for e in entries if int(e["hash"]) != damaged]
                await client.evict(snap_chain, tier="GPU")
                await client.evict(snap_chain, tier="ARRAY")
                assert (await client.lookup(snap_chain))["leading"]["SNAPSHOT"] == len(snap_chain)
                for h in snap_chain:
                    assert await client.get_slice(h) == data_of(h)
    finally:
        proc2.stop()
    back = sum(1 for h in written - {damaged} if served.get(h))
    report = {
        "acked_puts": len(acked),
        "demoted_acked_before_kill": demoted_before,
        "array_files_after_kill": len(written),
        "recovered_on_start": stats["recovered"].get("array", 0),
        "indexed_after_restart": indexed,
        "fully_written_served_back": back,
        "served_total": len(served),
        "served_wrong": sum(1 for ok in served.values() if not ok),
        "corrupt_detected": after["corrupt"].get("array", 0),
        "snapshots_after_kill": len(manifests),
        "snapshot_slices_recovered": stats["recovered"].get("snapshot", 0),
        "snapshot_chain_served_alone": len(snap_chain),
    }
    print(json.dumps(report))
    assert report["served_wrong"] == 0
    # the damaged array copy is quarantined; the slice is served only from a good copy
    # (a snapshot holding it), never from the damaged file
    assert list((tmp_path / "array" / "quarantine").iterdir())
    assert served.get(damaged) in (None, True)
    assert report["corrupt_detected"] == 1
    assert back >= 0.99 * (len(written) - 1)
    assert after["corrupt"].get("snapshot", 0) == 0
    assert report["snapshots_after_kill"] > 0 and report["snapshot_chain_served_alone"] > 0
