"""tierd's KV socket (tierd.kvserver) with the connector's client (tierd.kvwire): a real
daemon, a real Unix socket, the real shared L1 memfd, the real array directory."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from contracts.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    decode_batch,
    decode_frames,
    encode_batch,
    encode_frames,
)
from tierd.daemon import Daemon
from tierd.kvwire import KvClient, KvSocketError
from tierd.settings import TierdSettings

SLOT = 64 * 1024


def settings(tmp_path: Path, name: str, **kw: object) -> TierdSettings:
    return TierdSettings(
        instance_id=name,
        l1_bytes=32 * SLOT,
        slice_bytes=SLOT,
        array_dir=tmp_path / "array",
        snapshot_dir=tmp_path / f"snap-{name}",
        kv_socket=tmp_path / f"{name}.sock",
        **kw,
    )


async def started(s: TierdSettings) -> Daemon:
    d = Daemon(s)
    await d.start()
    await d.wait_ready()
    return d


def save(client: KvClient, blocks: dict[int, bytes]) -> None:
    """What the connector's worker does after a step: reserve, copy in, commit."""
    offsets = client.call({"op": "reserve", "n": len(blocks)})["offsets"]
    assert len(offsets) == len(blocks)
    assert client.arena is not None
    items = []
    parent = None
    for off, (h, data) in zip(offsets, blocks.items(), strict=True):
        client.arena[off : off + len(data)] = data
        items.append([h, off, len(data), parent, 16])
        parent = h
    client.send({"op": "commit", "items": items})


def load(client: KvClient, hashes: list[int]) -> list[bytes | None]:
    answer = client.call({"op": "load", "hashes": hashes})
    assert client.arena is not None
    out: list[bytes | None] = []
    for slot in answer["slots"]:
        out.append(None if slot is None else bytes(client.arena[slot[0] : slot[0] + slot[1]]))
    client.send({"op": "release", "lease": answer["lease"]})
    return out


async def wait_for(cond: object, within_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + within_s
    while not cond():  # type: ignore[operator]
        assert loop.time() < end, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_save_on_one_tierd_load_on_another_through_the_shared_array(
    tmp_path: Path,
) -> None:
    a = await started(settings(tmp_path, "a"))
    b = await started(settings(tmp_path, "b"))
    try:
        blocks = {1000 + i: os.urandom(SLOT - 100 * i) for i in range(5)}
        ca = await asyncio.to_thread(KvClient, str(tmp_path / "a.sock"), "ns1", "worker")
        await asyncio.to_thread(save, ca, blocks)
        # written through to the shared array in the background
        await wait_for(lambda: len(a.store.array_index) == 5)
        cb = await asyncio.to_thread(KvClient, str(tmp_path / "b.sock"), "ns1", "scheduler")
        found = await asyncio.to_thread(cb.call, {"op": "lookup", "hashes": [*blocks, 7]})
        assert found["n"] == 5
        got = await asyncio.to_thread(load, cb, [*blocks, 7])
        assert got == [*blocks.values(), None]
        # on a: straight from L1
        assert await asyncio.to_thread(load, ca, list(blocks)[:2]) == list(blocks.values())[:2]
        kv = b.kv
        assert kv is not None and kv.counters["load_blocks"] == 5
        assert kv.counters["load_missing"] == 1
        ca.close()
        cb.close()
    finally:
        await a.close()
        await b.close()


async def test_a_corrupt_array_slice_is_not_served_and_is_quarantined(tmp_path: Path) -> None:
    a = await started(settings(tmp_path, "a"))
    b = await started(settings(tmp_path, "b"))
    try:
        blocks = {2000 + i: os.urandom(SLOT) for i in range(3)}
        ca = await asyncio.to_thread(KvClient, str(tmp_path / "a.sock"), "ns", "worker")
        await asyncio.to_thread(save, ca, blocks)
        await wait_for(lambda: len(a.store.array_index) == 3)
        path = a.store.array.path(2001)
        raw = bytearray(path.read_bytes())
        raw[-10] ^= 0xFF
        path.write_bytes(bytes(raw))
        cb = await asyncio.to_thread(KvClient, str(tmp_path / "b.sock"), "ns", "worker")
        got = await asyncio.to_thread(load, cb, list(blocks))
        assert got[0] == blocks[2000]
        assert got[1] is None
        assert got[2] == blocks[2002]  # later blocks still load; the connector stops at [1]
        assert b.store.counters.corrupt["array"] == 1
        assert any((tmp_path / "array" / "quarantine").iterdir())
        ca.close()
        cb.close()
    finally:
        await a.close()
        await b.close()


async def test_another_namespace_is_refused(tmp_path: Path) -> None:
    a = await started(settings(tmp_path, "a"))
    try:
        c = await asyncio.to_thread(KvClient, str(tmp_path / "a.sock"), "model-x", "worker")
        c.close()
        with pytest.raises(KvSocketError, match="namespace"):
            await asyncio.to_thread(KvClient, str(tmp_path / "a.sock"), "model-y", "worker")
    finally:
        await a.close()
    # the shared array remembers its namespace across restarts
    b = await started(settings(tmp_path, "b"))
    try:
        with pytest.raises(KvSocketError, match="namespace"):
            await asyncio.to_thread(KvClient, str(tmp_path / "b.sock"), "model-y", "worker")
    finally:
        await b.close()


async def test_a_dead_connector_gives_back_its_pins_and_slots(tmp_path: Path) -> None:
    a = await started(settings(tmp_path, "a"))
    try:
        c = await asyncio.to_thread(KvClient, str(tmp_path / "a.sock"), "ns", "worker")
        await asyncio.to_thread(save, c, {5: b"x" * 100})
        await wait_for(lambda: 5 in a.store.l1)
        free = a.store.l1.free_slots
        await asyncio.to_thread(c.call, {"op": "reserve", "n": 4})
        await asyncio.to_thread(c.call, {"op": "load", "hashes": [5]})
        assert a.store.l1.free_slots == free - 4
        entry = a.store.l1.entry(5)
        assert entry is not None
        assert entry.pins == 1
        c.close()
        await wait_for(lambda: a.store.l1.free_slots == free and entry.pins == 0)
    finally:
        await a.close()


async def test_tierd_gone_is_an_error_the_connector_can_count(tmp_path: Path) -> None:
    with pytest.raises(KvSocketError):
        await asyncio.to_thread(KvClient, str(tmp_path / "nobody.sock"), "ns", "worker")


async def test_engine_block_removed_lets_the_l1_copy_pass_the_gate_and_l1_is_published_as_cpu(
    tmp_path: Path,
) -> None:
    ctx = zmq.asyncio.Context()
    engine_pub = ctx.socket(zmq.PUB)
    engine_pub.setsockopt(zmq.LINGER, 0)
    engine_ep = f"ipc://{tmp_path}/engine.events"
    engine_pub.bind(engine_ep)
    tierd_ep = f"ipc://{tmp_path}/tierd.events"
    heard = ctx.socket(zmq.SUB)
    heard.setsockopt(zmq.LINGER, 0)
    heard.setsockopt_string(zmq.SUBSCRIBE, "")
    heard.connect(tierd_ep)
    a = await started(settings(tmp_path, "a", engine_events=engine_ep, events_endpoint=tierd_ep))
    try:
        c = await asyncio.to_thread(KvClient, str(tmp_path / "a.sock"), "ns", "worker")
        await asyncio.to_thread(save, c, {77: b"k" * 1000, 78: b"v" * 1000})
        await wait_for(lambda: 78 in a.store.l1)
        entry = a.store.l1.entry(77)
        assert entry is not None and not entry.sticky
        batch = EventBatch(time.time(), (BlockRemoved((77,), "GPU"), BlockRemoved((5,), "CPU")))
        seq = 0

        def heard_removal() -> bool:  # a PUB drops what it sends before the SUB is joined
            nonlocal seq
            engine_pub.send_multipart(encode_frames("", seq, encode_batch(batch)))
            seq += 1
            return entry.sticky

        await wait_for(heard_removal)
        assert a.engine_events is not None
        assert a.engine_events.counters["removed"] >= 1
        await asyncio.sleep(0.3)  # our SUB has long joined tierd's PUB by now
        await asyncio.to_thread(save, c, {80: b"z" * 1000})
        mediums: set[str | None] = set()
        while await heard.poll(2000):
            got = decode_batch(decode_frames(await heard.recv_multipart()).payload)
            mediums |= {
                e.medium
                for e in got.events
                if isinstance(e, BlockStored) and e.block_hashes == (80,)
            }
            if "ARRAY" in mediums and "CPU" in mediums:
                break
        assert mediums == {"CPU", "ARRAY"}  # tierd's L1 is the instance's host tier here
        c.close()
    finally:
        await a.close()
        heard.close()
        engine_pub.close()
        ctx.term()


async def test_a_peer_snapshots_what_another_tierd_wrote_and_serves_it_after_the_array_is_gone(
    tmp_path: Path,
) -> None:
    a = await started(settings(tmp_path, "a"))
    b = await started(settings(tmp_path, "b"))
    try:
        blocks = {3000 + i: os.urandom(SLOT // 2) for i in range(4)}
        ca = await asyncio.to_thread(KvClient, str(tmp_path / "a.sock"), "ns", "worker")
        await asyncio.to_thread(save, ca, blocks)
        await wait_for(lambda: len(a.store.array_index) == 4)
        snap = await b.snapshotter.snapshot(list(blocks))  # b never saw these slices
        assert snap["slices"] == 4
        await a.evict(list(blocks), "ARRAY")
        assert not any(a.store.array.exists(h) for h in blocks)
        cb = await asyncio.to_thread(KvClient, str(tmp_path / "b.sock"), "ns", "worker")
        found = await asyncio.to_thread(cb.call, {"op": "lookup", "hashes": list(blocks)})
        assert found["n"] == 4
        # b's index may still name the array (it learnt the files before a deleted them):
        # the load finds them gone and falls back to the snapshot
        assert await asyncio.to_thread(load, cb, list(blocks)) == list(blocks.values())
        assert b.store.counters.bytes_moved["snapshot_to_l1"] >= 4 * (SLOT // 2)
        ca.close()
        cb.close()
    finally:
        await a.close()
        await b.close()


async def test_the_engines_events_tell_tierd_which_blocks_it_holds(tmp_path: Path) -> None:
    ctx = zmq.asyncio.Context()
    engine_pub = ctx.socket(zmq.PUB)
    engine_pub.setsockopt(zmq.LINGER, 0)
    engine_ep = f"ipc://{tmp_path}/engine.events"
    engine_pub.bind(engine_ep)
    a = await started(settings(tmp_path, "a", engine_events=engine_ep))
    seq = 0

    def publish(*events: BlockStored | BlockRemoved | AllBlocksCleared) -> None:
        nonlocal seq
        batch = EventBatch(time.time(), events)
        engine_pub.send_multipart(encode_frames("", seq, encode_batch(batch)))
        seq += 1

    try:
        held = a.residency
        assert held is not None
        stored = BlockStored((90, 91, 92), None, medium="GPU")

        def heard_stored() -> bool:  # a PUB drops what it sends before the SUB is joined
            publish(stored, BlockStored((7,), None, medium="CPU"))
            return 92 in held

        await wait_for(heard_stored)
        assert 7 not in held  # the engine's host tier is not its device cache
        publish(BlockRemoved((91,), "GPU"))
        await wait_for(lambda: 91 not in held)
        assert held.held_prefix([90, 91, 92]) == 1
        publish(AllBlocksCleared())
        await wait_for(lambda: len(held) == 0)
    finally:
        await a.close()
        engine_pub.close()
        ctx.term()
