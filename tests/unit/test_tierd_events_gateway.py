"""Two publishers for one instance (an engine and its tierd): each owns its tiers, so the
router prices what the engine will load from tierd, and one publisher's gap, restart or
AllBlocksCleared never erases what the other said (`gateway.fleet.tierd_events`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import zmq
import zmq.asyncio

from contracts.kv_events import (
    AllBlocksCleared,
    BlockStored,
    EventBatch,
    encode_batch,
    encode_frames,
)
from contracts.tiers import Medium, Tier
from gateway.config.settings import InstanceSettings, Settings
from gateway.fleet.kv_events import KvEventConsumer
from gateway.fleet.tierd_events import (
    ENGINE_TIERS,
    TIERD_TIERS,
    engine_tiers,
    subscribe,
    tierd_endpoints,
    unsubscribe,
)
from router.index import PrefixIndex

CHAIN = [11, 12, 13, 14, 15]


def frames(seq: int, *events: object) -> list[bytes]:
    return encode_frames("", seq, encode_batch(EventBatch(1.0, tuple(events))))  # type: ignore[arg-type]


def stored(hashes: list[int], medium: str) -> BlockStored:
    return BlockStored(tuple(hashes), None, (), 128, None, medium, None)


def pair(index: PrefixIndex) -> tuple[KvEventConsumer, KvEventConsumer]:
    engine = KvEventConsumer(index, {"e0": "ipc:///nonexistent-e"}, tiers={"e0": ENGINE_TIERS})
    tierd = KvEventConsumer(index, {"e0": "ipc:///nonexistent-t"}, tiers={"e0": TIERD_TIERS})
    return engine, tierd


def test_tierd_host_blocks_are_priced_past_the_engines_own() -> None:
    index = PrefixIndex()
    engine, tierd = pair(index)
    engine.handle("e0", frames(0, stored(CHAIN[:2], Medium.GPU)))
    # tierd publishes its arena as host memory, and what it wrote to the shared array
    tierd.handle("e0", frames(0, stored(CHAIN[:4], Medium.CPU), stored([15], Medium.ARRAY)))
    assert index.match(CHAIN, ["e0", "e1"]) == {
        "e0": {Tier.HBM: 2, Tier.HOST: 2, Tier.ARRAY: 1},
        "e1": {},  # the chain's first block is in no tier e1 can read
    }


def test_a_tierd_gap_or_clear_leaves_the_engines_blocks() -> None:
    index = PrefixIndex()
    engine, tierd = pair(index)
    engine.handle("e0", frames(0, stored(CHAIN[:2], Medium.GPU)))
    tierd.handle("e0", frames(0, stored(CHAIN, Medium.CPU)))
    tierd.handle("e0", frames(5, stored([99], Medium.CPU)))  # a gap: tierd's view is stale
    assert index.match(CHAIN, ["e0"]) == {"e0": {Tier.HBM: 2}}
    tierd.handle("e0", frames(6, stored(CHAIN, Medium.CPU)))
    engine.handle("e0", frames(1, AllBlocksCleared()))  # the engine's cache emptied
    assert index.match(CHAIN, ["e0"]) == {"e0": {Tier.HOST: 5}}
    tierd.handle("e0", frames(7, AllBlocksCleared()))
    assert index.match(CHAIN, ["e0"]) == {"e0": {}}


def test_settings_name_a_tierd_events_endpoint() -> None:
    settings = Settings(
        instances=[
            {"id": "e0", "url": "http://127.0.0.1:1", "tierd_events_endpoint": "ipc:///t0"},
            {"id": "e1", "url": "http://127.0.0.1:2"},
        ]
    )
    assert tierd_endpoints(settings) == {"e0": "ipc:///t0"}
    assert engine_tiers(settings) == {"e0": ENGINE_TIERS}  # e1's engine owns every tier


async def test_an_instance_added_at_runtime_gets_its_tierds_events_too(tmp_path: Path) -> None:
    index = PrefixIndex()
    engine = KvEventConsumer(index, {})
    tierd = KvEventConsumer(index, {})
    ctx = zmq.asyncio.Context()
    pubs = {}
    for name in ("engine", "tierd"):
        pubs[name] = ctx.socket(zmq.PUB)
        pubs[name].setsockopt(zmq.LINGER, 0)
        pubs[name].bind(f"ipc://{tmp_path}/{name}")
    spec = InstanceSettings(
        id="e9",
        url="http://127.0.0.1:1",
        kv_events_endpoint=f"ipc://{tmp_path}/engine",
        tierd_events_endpoint=f"ipc://{tmp_path}/tierd",
    )
    await engine.start()
    await tierd.start()
    try:
        subscribe(engine, tierd, spec)
        want = {"e9": {Tier.HBM: 2, Tier.HOST: 3}}
        seq = 0
        for _ in range(100):  # a SUB socket joins a moment after it connects: publish again
            await pubs["engine"].send_multipart(frames(seq, stored(CHAIN[:2], Medium.GPU)))
            await pubs["tierd"].send_multipart(frames(seq, stored(CHAIN, Medium.CPU)))
            seq += 1
            await asyncio.sleep(0.02)
            if index.match(CHAIN, ["e9"]) == want:
                break
        assert index.match(CHAIN, ["e9"]) == want
        # the engine's feed owns HBM only, as at startup: its clear leaves tierd's blocks
        await pubs["engine"].send_multipart(frames(seq, AllBlocksCleared()))
        for _ in range(100):
            await asyncio.sleep(0.02)
            if index.match(CHAIN, ["e9"]) == {"e9": {Tier.HOST: 5}}:
                break
        assert index.match(CHAIN, ["e9"]) == {"e9": {Tier.HOST: 5}}
        unsubscribe(engine, tierd, "e9")
        assert "e9" not in engine.endpoints and "e9" not in tierd.endpoints
        assert "e9" not in engine.tiers and "e9" not in tierd.tiers
    finally:
        await engine.close()
        await tierd.close()
        for sock in pubs.values():
            sock.close()
        ctx.term()
