"""KV events over real ZMQ on loopback: publisher -> consumer -> prefix index, including gaps,
restarts and malformed messages; and end to end from a simulated engine through a gateway."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import httpx
import msgpack
import pytest

from contracts.kv_events import EventEncoding
from contracts.tiers import Tier
from gateway.fleet.kv_events import KvEventConsumer
from router.index import ARRAY, PrefixIndex
from sim.kv_publisher import KvEventPublisher
from tests.support.procs import ManagedProcess, free_port, python_module


async def until(cond: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    """Poll `cond` until it holds (a wait, not a timed assertion: only a hang fails it)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"never happened: {what}")
        await asyncio.sleep(0.01)


def tiers(index: PrefixIndex, instance: str, hashes: list[int]) -> dict[Tier, int]:
    return dict(index.match(hashes, [instance])[instance])


class Rig:
    def __init__(self, index: PrefixIndex, consumer: KvEventConsumer, pub: KvEventPublisher):
        self.index, self.consumer, self.pub = index, consumer, pub

    def stats(self) -> dict[str, object]:
        return self.consumer.stats()["i0"]

    async def joined(self) -> None:
        """PUB drops what it sends before a subscriber has joined: send probes (an empty
        batch) until one arrives, then reset the consumer's view of the sequence."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while not self.stats()["batches"]:
            assert loop.time() < deadline, "subscriber never joined"
            await self.pub.publish([])
            await asyncio.sleep(0.02)


@pytest.fixture(params=["map", "array"])
async def rig(request: pytest.FixtureRequest) -> AsyncIterator[Rig]:
    encoding: EventEncoding = request.param
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    pub = KvEventPublisher(endpoint, encoding=encoding)
    index = PrefixIndex()
    consumer = KvEventConsumer(index, {"i0": endpoint}, topic="kv-events")  # filtering on
    await consumer.start()
    r = Rig(index, consumer, pub)
    try:
        await r.joined()
        yield r
    finally:
        await consumer.close()
        pub.close()


async def test_stored_removed_cleared_reach_the_index(rig: Rig) -> None:
    await rig.pub.stored([1, 2, 3], parent=None, token_ids=[5] * 16, block_size=16)
    await rig.pub.stored([4], medium="CPU")
    await rig.pub.stored([5, 6], medium="STORAGE")
    await rig.pub.stored([7], medium="SNAPSHOT")
    await until(lambda: rig.stats()["blocks_stored"] == 7, "7 blocks stored")
    assert tiers(rig.index, "i0", [1, 2, 3, 4]) == {Tier.HBM: 3, Tier.HOST: 1}
    assert tiers(rig.index, "elsewhere", [5, 6]) == {Tier.ARRAY: 2}
    assert tiers(rig.index, "i0", [7]) == {Tier.SNAPSHOT: 1}
    await rig.pub.removed([3])
    await until(lambda: rig.stats()["blocks_removed"] == 1, "1 block removed")
    assert tiers(rig.index, "i0", [1, 2, 3]) == {Tier.HBM: 2}
    await rig.pub.cleared()
    await until(lambda: rig.stats()["cleared"] == 1, "cleared")
    assert rig.index.blocks_held("i0") == 0
    assert rig.index.blocks_held(ARRAY) == 2
    s = rig.stats()
    assert (s["gaps"], s["restarts"], s["malformed"]) == (0, 0, 0)


async def test_a_gap_drops_the_instance_and_is_counted(rig: Rig) -> None:
    await rig.pub.stored([1, 2])
    await until(lambda: rig.index.blocks_held("i0") == 2, "stored")
    rig.pub.seq += 3  # three batches lost on the way
    await rig.pub.stored([9])
    await until(lambda: rig.stats()["gaps"] == 1, "gap seen")
    assert rig.stats()["missed_batches"] == 3
    assert tiers(rig.index, "i0", [1]) == {}  # stale blocks dropped
    assert tiers(rig.index, "i0", [9]) == {Tier.HBM: 1}  # the new batch applies


async def test_a_publisher_restart_drops_the_instance(rig: Rig) -> None:
    await rig.pub.stored([1, 2])
    await until(lambda: rig.index.blocks_held("i0") == 2, "stored")
    rig.pub.seq = 0  # what a restarted publisher does
    await rig.pub.stored([3])
    await until(lambda: rig.stats()["restarts"] == 1, "restart seen")
    assert tiers(rig.index, "i0", [1, 2]) == {}
    assert tiers(rig.index, "i0", [3]) == {Tier.HBM: 1}


async def test_malformed_messages_are_counted_and_skipped(rig: Rig) -> None:
    await rig.pub.stored([1])
    await rig.pub.send_frames([b"kv-events", b"short", b"x"])  # bad sequence frame
    await rig.pub.send_frames([b"kv-events", b"only two frames"])
    await until(lambda: rig.stats()["malformed"] == 2, "two malformed messages")
    assert tiers(rig.index, "i0", [1]) == {Tier.HBM: 1}  # skipped: nothing else changed
    await rig.pub.send_frames([b"other-topic", (5).to_bytes(8, "big"), b"x"])
    await until(lambda: rig.stats()["other_topic"] == 1, "a message on another topic")
    await rig.pub.send_raw(b"\xc1 not msgpack")  # an undecodable batch is a lost batch
    await rig.pub.send_raw(msgpack.packb([1.0, [["BlockStored", "not-a-list"]]]))
    await until(lambda: rig.stats()["malformed"] == 4, "two undecodable batches")
    assert rig.index.blocks_held("i0") == 0
    await rig.pub.stored([2])  # and the consumer keeps going
    await until(lambda: tiers(rig.index, "i0", [2]) == {Tier.HBM: 1}, "consumer still alive")
    assert rig.stats()["gaps"] == 0


# -- end to end: sim engine publishes, the gateway consumes ----------------------------------


@pytest.fixture
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="kvev-") as d:
        yield Path(d)


def test_engine_events_reach_the_gateway_index(workdir: Path) -> None:
    engine_port, events_port, gw_port = free_port(), free_port(), free_port()
    endpoint = f"tcp://127.0.0.1:{events_port}"
    engine = ManagedProcess(
        python_module(
            "sim.engine",
            *("--host", "127.0.0.1", "--port", str(engine_port), "--instance-id", "e0"),
            *("--time-scale", "0.001", "--kv-events-endpoint", endpoint),
        ),
        workdir / "engine.log",
    )
    instances = [
        {"id": "e0", "url": f"http://127.0.0.1:{engine_port}", "kv_events_endpoint": endpoint}
    ]
    env = {
        "WARMGATE_INSTANCES": json.dumps(instances),
        "WARMGATE_KV_EVENTS__ENABLED": "true",
        "WARMGATE_TIERS__PREFETCH": "false",
    }
    gateway = ManagedProcess(
        python_module(
            "uvicorn",
            "gateway.app:create_app",
            "--factory",
            *("--host", "127.0.0.1", "--port", str(gw_port), "--log-level", "warning"),
        ),
        workdir / "gateway.log",
        env={k: v for k, v in {**os.environ, **env}.items() if k != "WARMGATE_CONFIG"},
    )
    base = f"http://127.0.0.1:{gw_port}"
    try:
        engine.wait_http(f"http://127.0.0.1:{engine_port}/health")
        gateway.wait_http(f"{base}/readyz")
        with httpx.Client(base_url=base, timeout=30) as client:
            body = {
                "model": "sim-qwen2.5-32b",
                "messages": [{"role": "user", "content": "the world state of the zone " * 200}],
                "max_tokens": 4,
            }
            # The SUB socket joins asynchronously: send until the engine's events show up.
            for _ in range(100):
                r = client.post("/v1/chat/completions", json=body)
                assert r.status_code == 200, r.text
                source = client.get("/readyz").json()["checks"]["kv_events"]["sources"]["e0"]
                if source["blocks_stored"] > 0:
                    break
            assert source["blocks_stored"] > 0, gateway.tail()
            assert source["malformed"] == 0
            # The index holds the engine's blocks beside the gateway's own predictions (the
            # engine hashes real tokens, approximate mode hashes characters: no overlap).
            index = client.get("/admin/stats").json()["router"]["index"]
            from_events = index["blocks_by_instance"]["e0"] - index["predicted_by_instance"]["e0"]
            assert 1 <= from_events <= source["blocks_stored"]
            metrics = client.get("/metrics").text
            assert 'warmgate_kv_event_blocks_total{action="stored",instance="e0"}' in metrics
    finally:
        gateway.stop()
        engine.stop()


def test_blocks_of_another_size_than_precise_modes_are_flagged() -> None:
    """An engine cutting 128-token blocks in front of a gateway cutting 16 is said loudly."""
    index = PrefixIndex()
    consumer = KvEventConsumer(index, {"i0": "ipc:///nonexistent"}, block_size=16)
    event = {"type": "BlockStored", "block_hashes": [7], "parent_block_hash": None,
             "token_ids": list(range(128)), "block_size": 128, "medium": "GPU"}  # fmt: skip
    frames = [b"", (0).to_bytes(8, "big"), msgpack.packb([1.0, [event]])]
    consumer.handle("i0", frames)
    assert consumer.stats()["i0"]["block_size_mismatch"] == 1
    ok = KvEventConsumer(index, {"i0": "ipc:///nonexistent"}, block_size=128)
    ok.handle("i0", frames)
    assert ok.stats()["i0"]["block_size_mismatch"] == 0
