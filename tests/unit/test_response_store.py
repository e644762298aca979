"""Stored responses for `previous_response_id`: the memory store's TTL and size bounds (on a
clock the test moves), the conversation codec, and the chat body a continuation becomes."""

from __future__ import annotations

import asyncio

import pytest

from gateway.config.guards import RequestLimits
from gateway.config.settings import ResponsesSettings, Settings, StateSettings
from gateway.errors import OpenAIError
from gateway.http.responses_api import prepare
from gateway.pipeline.response_store import (
    Conversation,
    MemoryResponseStore,
    RedisResponseStore,
    build_response_store,
    load,
    save,
)

LIMITS = RequestLimits()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_memory_store_expires_after_ttl() -> None:
    clock = Clock()
    store = MemoryResponseStore(ttl_s=10, max_bytes=100, max_total_bytes=1000, clock=clock)

    async def run() -> None:
        assert await store.put("a", b"one")
        clock.now += 5
        assert await store.put("b", b"two")
        assert await store.get("a") == b"one"
        clock.now += 5  # a's TTL is over, b's not
        assert await store.get("a") is None
        assert await store.get("b") == b"two"
        assert len(store) == 1 and store.total_bytes == 3
        clock.now += 5
        assert await store.get("b") is None
        assert len(store) == 0 and store.total_bytes == 0

    asyncio.run(run())


def test_memory_store_bounds_sizes() -> None:
    store = MemoryResponseStore(ttl_s=10, max_bytes=40, max_total_bytes=100, clock=Clock())

    async def run() -> None:
        assert not await store.put("big", b"x" * 41)  # over max_bytes: not stored
        assert await store.get("big") is None
        for i in range(5):
            assert await store.put(f"r{i}", b"y" * 30)
        assert store.total_bytes <= 100
        assert await store.get("r0") is None and await store.get("r1") is None  # oldest first
        assert await store.get("r4") == b"y" * 30
        assert await store.put("r4", b"z" * 10)  # replaced, counted once
        assert store.total_bytes == 70 and await store.get("r4") == b"z" * 10

    asyncio.run(run())


def test_conversation_round_trip_and_junk() -> None:
    c = Conversation("Be Brom.", [{"role": "user", "content": "Hi"}], "player-1")
    assert Conversation.decode(c.encode()) == c
    assert Conversation.decode(b"not json") is None
    assert Conversation.decode(b'{"messages": 3}') is None


def test_build_picks_redis_when_shared_state_is() -> None:
    memory = build_response_store(Settings())
    assert isinstance(memory, MemoryResponseStore) and memory.ttl_s == 3600
    redis = build_response_store(
        Settings(
            state=StateSettings(backend="redis", redis_url="redis://127.0.0.1:1/0", pool="p"),
            responses=ResponsesSettings(ttl_s=2.5),
        )
    )
    assert isinstance(redis, RedisResponseStore) and redis.ttl_ms == 2500
    assert redis.keys.response("resp_1") == "warmgate:{p}:response:resp_1"
    asyncio.run(redis.aclose())


def test_continuation_is_the_whole_conversation() -> None:
    store = MemoryResponseStore(ttl_s=10, max_bytes=10_000, max_total_bytes=100_000)
    prior = Conversation(
        "You are Brom.",
        [{"role": "user", "content": "A sword?"}, {"role": "assistant", "content": "Steel."}],
        "player-9",
    )

    async def run() -> None:
        assert await save(store, "resp_1", prior)
        chat, call = await prepare(
            {"model": "m", "previous_response_id": "resp_1", "input": "How much?"},
            LIMITS,
            store,
        )
        assert chat["messages"] == [
            {"role": "system", "content": "You are Brom."},
            {"role": "user", "content": "A sword?"},
            {"role": "assistant", "content": "Steel."},
            {"role": "user", "content": "How much?"},
        ]
        assert chat["prompt_cache_key"] == "player-9"  # the chain's session sticks
        assert call.store is store
        assert call.conversation.messages == chat["messages"][1:]
        # new instructions replace the chain's; a session of its own wins
        chat, _ = await prepare(
            {
                "model": "m",
                "previous_response_id": "resp_1",
                "instructions": "You are Mira.",
                "input": "Hi",
                "user": "u2",
                "store": False,
            },
            LIMITS,
            store,
        )
        assert chat["messages"][0] == {"role": "system", "content": "You are Mira."}
        assert "prompt_cache_key" not in chat and chat["user"] == "u2"
        assert await load(store, "x" * 500) is None

    asyncio.run(run())


@pytest.mark.parametrize("previous", ["resp_unknown", "x" * 500])
def test_unknown_previous_is_not_found(previous: str) -> None:
    store = MemoryResponseStore(ttl_s=10, max_bytes=1000, max_total_bytes=1000)
    with pytest.raises(OpenAIError) as info:
        asyncio.run(
            prepare({"model": "m", "previous_response_id": previous, "input": "x"}, LIMITS, store)
        )
    err = info.value
    assert (err.status, err.type, err.param, err.code) == (
        400,
        "invalid_request_error",
        "previous_response_id",
        "previous_response_not_found",
    )


def test_store_false_is_not_stored() -> None:
    store = MemoryResponseStore(ttl_s=10, max_bytes=1000, max_total_bytes=1000)
    _, kept = asyncio.run(prepare({"model": "m", "input": "x"}, LIMITS, store))
    _, not_kept = asyncio.run(prepare({"model": "m", "input": "x", "store": False}, LIMITS, store))
    assert kept.store is store and not_kept.store is None
