"""The shared-state contract against a real Redis (a unique pool per test), plus what only
Redis has: key layout with the cluster hash tag, approximate trimming, and unavailability."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from router.state.base import STREAM_START, StateUnavailableError
from router.state.redis import RedisState
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
