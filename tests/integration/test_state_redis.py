"""The shared-state contract against a real Redis (a unique pool per test), plus what only
Redis has: key layout with the cluster hash tag, approximate trimming, and unavailability."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from contracts.kv_events import BlockRemoved, BlockStored, EventBatch, KvEvent, encode_batch
from contracts.tiers import Tier
from gateway.config.settings import Settings
from gateway.lifetime import Lifetime
from gateway.pipeline.shared_state import start_shared_state
from router.index import ARRAY, PrefixIndex
from router.load import LoadView
from router.policies.round_robin import RoundRobinPolicy
from router.router import Router
from router.state.base import STREAM_START, StateUnavailableError
from router.state.redis import RedisState
from router.state.sync import StateSync, SyncConfig, SyncObservers
from tests.support.procs import free_port
from tests.unit.test_state_memory import StateContract


class TestRedisState(StateContract):
    @pytest.fixture
    def pool(self) -> str:
        return f"test-{uuid.uuid4().hex[:12]}"

    @pytest.fixture
    async def state(self, redis_url: str, pool: str) -> AsyncIterator[RedisState]:
        state = RedisState(redis_url, pool)
        yield state
        await state.close()

    @pytest.fixture
    async def other(self, redis_url: str, pool: str) -> AsyncIterator[RedisState]:
        state = RedisState(redis_url, pool)
        yield state
        await state.close()

    async def advance(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


async def test_keys_carry_the_pool_hash_tag(redis_url: str) -> None:
    pool = f"tag-{uuid.uuid4().hex[:8]}"
    state = RedisState(redis_url, pool)
    client = aioredis.Redis.from_url(redis_url)
    try:
        await state.bind_session("p", "i0", 30)
        await state.publish_inflight("r1", {"i0": 1}, 30)
        await state.append_event("i0", 0, b"x")
        keys = sorted(k.decode() for k in await client.keys(f"warmgate:{{{pool}}}:*"))
        assert keys == [
            f"warmgate:{{{pool}}}:events",
            f"warmgate:{{{pool}}}:inflight",
            f"warmgate:{{{pool}}}:replicas",
            f"warmgate:{{{pool}}}:session:p",
        ]
        fields = await client.xrange(f"warmgate:{{{pool}}}:events")
        assert fields[0][1] == {b"instance": b"i0", b"seq": b"0", b"batch": b"x"}
        await client.delete(*keys)
    finally:
        await client.aclose()
        await state.close()


async def test_stream_is_trimmed_approximately(redis_url: str) -> None:
    pool = f"trim-{uuid.uuid4().hex[:8]}"
    state = RedisState(redis_url, pool, stream_maxlen=100)
    try:
        for n in range(1000):
            await state.append_event("i0", n, b"x")
        entries = await state.read_events(STREAM_START, 10_000, 0)
        assert 100 <= len(entries) < 1000
        assert entries[-1].seq == 999
    finally:
        await state._r.delete(state.key("events"))
        await state.close()


async def test_an_unreachable_redis_raises_state_unavailable() -> None:
    state = RedisState(f"redis://127.0.0.1:{free_port()}/0", "nowhere", timeout_s=0.2)
    try:
        with pytest.raises(StateUnavailableError):
            await state.ping()
        with pytest.raises(StateUnavailableError):
            await state.bind_session("p", "i0", 1)
        with pytest.raises(StateUnavailableError):
            await state.read_events(STREAM_START, 10, 0.1)
        with pytest.raises(StateUnavailableError):
            await state.publish_inflight("r", {"i0": 1}, 1)
    finally:
        await state.close()


async def test_a_new_replica_bootstraps_from_the_snapshot_then_reads_the_stream(
    redis_url: str,
) -> None:
    pool = f"boot-{uuid.uuid4().hex[:8]}"
    first, second = RedisState(redis_url, pool), RedisState(redis_url, pool)
    tierd = RedisState(redis_url, pool)  # what tierd does: XADD batches to the stream

    async def publish(seq: int, *events: KvEvent) -> None:
        await tierd.append_event("e0", seq, encode_batch(EventBatch(1.0, events)))

    outcomes: list[str] = []
    observers = SyncObservers(on_stream_batch=outcomes.append)
    try:
        await publish(0, BlockStored((1, 2, 3), medium="GPU"))
        await publish(1, BlockStored((4, 5), medium="ARRAY"))
        old = StateSync(first, PrefixIndex(), LoadView(), ["e0"], SyncConfig("r1"))
        await old.bootstrap()
        assert await old.read_stream_once(0) == 2
        assert await old.write_snapshot_once()
        assert not await old.write_snapshot_once()  # nothing new since
        await publish(2, BlockRemoved((2,), medium="GPU"))
        await publish(3, BlockStored((6,), medium="CPU"))
        # The stream forgets what the snapshot covers: only the snapshot can bring it back.
        await tierd._r.xtrim(tierd.key("events"), maxlen=2, approximate=False)

        index = PrefixIndex()
        new = StateSync(second, index, LoadView(), ["e0"], SyncConfig("r2", observers=observers))
        await new.bootstrap()
        assert await new.read_stream_once(0) == 2
        assert dict(index.match([1, 2, 3], ["e0"])["e0"]) == {Tier.HBM: 1}
        assert dict(index.match([3], ["e0"])["e0"]) == {Tier.HBM: 1}
        assert dict(index.match([6], ["e0"])["e0"]) == {Tier.HOST: 1}
        assert dict(index.match([4, 5], ["elsewhere"])["elsewhere"]) == {Tier.ARRAY: 2}
        assert new.residency.last_seq("e0") == 3
        assert outcomes == ["ok", "ok"]

        await tierd.append_event("e0", 4, b"\xc1garbage")  # lost batch: e0's blocks dropped
        await publish(5, BlockStored((7,), medium="GPU"))
        assert await new.read_stream_once(0) == 2
        assert outcomes[2:] == ["malformed", "ok"]
        assert index.blocks_held("e0") == 1 and index.blocks_held(ARRAY) == 0
        assert new.status()["stream_blocks"] == 1
    finally:
        await tierd._r.delete(
            tierd.key("events"), tierd.key("snapshot"), tierd.key("lock", "snapshot")
        )
        for s in (first, second, tierd):
            await s.close()


async def test_inflight_sync_feeds_each_replica_the_others_counts(redis_url: str) -> None:
    pool = f"sync-{uuid.uuid4().hex[:8]}"
    stores = [RedisState(redis_url, pool), RedisState(redis_url, pool)]
    loads = [LoadView(), LoadView()]
    syncs = [
        StateSync(s, PrefixIndex(), lv, ["e0", "e1"], SyncConfig(f"r{n}", inflight_ttl_s=1.0))
        for n, (s, lv) in enumerate(zip(stores, loads, strict=True))
    ]
    try:
        for _ in range(3):
            loads[0].on_dispatch("e0", 100)
        loads[1].on_dispatch("e1", 100)
        for s in syncs:
            await s.sync_inflight_once()
        await syncs[0].sync_inflight_once()  # r0 reads after r1 published
        assert loads[0].view("e0")[0] == 3 and loads[0].view("e1")[0] == 1
        assert loads[1].view("e0")[0] == 3 and loads[1].view("e1")[0] == 1
        assert loads[1].local_in_flight("e0") == 0
        assert syncs[1].remote_replicas == ["r0"]
        await asyncio.sleep(1.5)  # r0 stops publishing: its counts expire
        await syncs[1].sync_inflight_once()
        assert loads[1].view("e0")[0] == 0 and syncs[1].remote_replicas == []
    finally:
        for s in stores:
            await s.close()


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_the_sync_loops_run_only_over_a_store_others_share(
    backend: str, redis_url: str
) -> None:
    """A memory store is this process's alone: nothing to publish or read back, so no loop
    wakes the gateway for it; Redis is read and written by other replicas and tierds."""
    state = {"backend": backend, "pool": f"t-{uuid.uuid4().hex[:8]}"}
    if backend == "redis":
        state["redis_url"] = redis_url
    settings = Settings.model_validate(
        {"instances": [{"id": "i0", "url": "http://127.0.0.1:9"}], "state": state}
    )
    life = Lifetime()
    router = Router(RoundRobinPolicy(), PrefixIndex(ttl_s=60.0), LoadView())
    bindings = await start_shared_state(settings, router, CollectorRegistry(), life)
    try:
        loops = sorted(t.get_name() for t in life.background)
        expected = ["shared-inflight", "shared-snapshots", "shared-stream"]
        assert loops == (expected if backend == "redis" else [])
        status = await bindings.readiness()
        assert status["ok"] and status["backend"] == backend
    finally:
        await life.end()
