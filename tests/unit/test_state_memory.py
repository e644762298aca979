"""The shared-state contract, run against the memory backend (and, from
tests/integration/test_state_redis.py, against the Redis backend)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from router.state.base import STREAM_START, SharedState, Snapshot, stream_id_key, sum_loads
from router.state.memory import MemoryState


class StateContract:
    """Every backend must pass these. Subclasses provide `state`, `other` (a second handle on
    the same pool, as another replica would hold) and `advance(seconds)`."""

    async def advance(self, seconds: float) -> None:
        raise NotImplementedError

    async def test_first_binding_wins_and_the_ttl_is_refreshed(
        self, state: SharedState, other: SharedState
    ) -> None:
        assert await state.get_session("p1", 1.0) is None
        assert await state.bind_session("p1", "i0", 1.0) == "i0"
        assert await other.bind_session("p1", "i1", 1.0) == "i0"  # the other replica agrees
        assert await other.get_session("p1", 1.0) == "i0"
        await self.advance(0.6)
        assert await state.get_session("p1", 1.0) == "i0"  # use refreshes the TTL
        await self.advance(0.6)
        assert await other.get_session("p1", 1.0) == "i0"
        await self.advance(1.3)
        assert await state.get_session("p1", 1.0) is None  # expired
        assert await other.bind_session("p1", "i1", 1.0) == "i1"

    async def test_rebind_is_compare_and_set(self, state: SharedState, other: SharedState) -> None:
        await state.bind_session("p", "i0", 5.0)
        assert await state.rebind_session("p", "i0", "i1", 5.0) == "i1"
        # A replica that still believes i0 loses to the one that moved it.
        assert await other.rebind_session("p", "i0", "i2", 5.0) == "i1"
        assert await other.rebind_session("p", None, "i2", 5.0) == "i1"
        await state.unbind_session("p")
        assert await other.rebind_session("p", "i0", "i2", 5.0) == "i2"
        assert await state.get_session("p", 5.0) == "i2"

    async def test_inflight_counts_per_replica_expire_when_not_republished(
        self, state: SharedState, other: SharedState
    ) -> None:
        await state.publish_inflight("r1", {"i0": 3, "i1": 1}, 1.0)
        await other.publish_inflight("r2", {"i0": 2}, 5.0)
        loads = {load.replica: dict(load.counts) for load in await other.read_inflight()}
        assert loads == {"r1": {"i0": 3, "i1": 1}, "r2": {"i0": 2}}
        assert sum_loads(await state.read_inflight()) == {"i0": 5, "i1": 1}
        await state.publish_inflight("r1", {"i1": 4}, 1.0)  # replaces, not adds
        assert sum_loads(await state.read_inflight()) == {"i0": 2, "i1": 4}
        await self.advance(1.5)  # r1 died: its counts go, r2's stay
        assert [load.replica for load in await other.read_inflight()] == ["r2"]

    async def test_stream_is_read_in_full_by_every_reader(
        self, state: SharedState, other: SharedState
    ) -> None:
        assert await state.read_events(STREAM_START, 10, 0) == []
        assert await state.oldest_event_id() is None
        ids = [await state.append_event("i0", n, bytes([n]) * 3) for n in range(5)]
        assert sorted(ids, key=stream_id_key) == ids
        for reader in (state, other):
            entries = await reader.read_events(STREAM_START, 100, 0)
            assert [(e.instance, e.seq, e.batch) for e in entries] == [
                ("i0", n, bytes([n]) * 3) for n in range(5)
            ]
            assert [e.id for e in entries] == ids
        page = await other.read_events(ids[1], 2, 0)
        assert [e.seq for e in page] == [2, 3]
        assert await state.oldest_event_id() == ids[0]

    async def test_a_blocked_read_wakes_on_append(
        self, state: SharedState, other: SharedState
    ) -> None:
        last = await state.append_event("i0", 0, b"a")
        reader = asyncio.create_task(other.read_events(last, 10, 5.0))
        await asyncio.sleep(0.05)
        await state.append_event("i1", 0, b"b")
        entries = await reader
        assert [(e.instance, e.batch) for e in entries] == [("i1", b"b")]
        assert await other.read_events(entries[-1].id, 10, 0.05) == []

    async def test_snapshot_and_lock(self, state: SharedState, other: SharedState) -> None:
        assert await other.load_snapshot() is None
        await state.save_snapshot(Snapshot(b"\x00data\xff", "12-3", 1700000000.5))
        snap = await other.load_snapshot()
        assert snap is not None
        assert (snap.data, snap.stream_id, snap.written_at_s) == (
            b"\x00data\xff",
            "12-3",
            1700000000.5,
        )
        assert await state.acquire_lock("snapshot", "r1", 1.0)
        assert not await other.acquire_lock("snapshot", "r2", 1.0)
        assert await state.acquire_lock("snapshot", "r1", 1.0)  # the owner extends it
        await other.release_lock("snapshot", "r2")  # not the owner: no effect
        assert not await other.acquire_lock("snapshot", "r2", 1.0)
        await state.release_lock("snapshot", "r1")
        assert await other.acquire_lock("snapshot", "r2", 0.5)
        await self.advance(0.8)
        assert await state.acquire_lock("snapshot", "r1", 1.0)  # the holder's lease ran out


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class TestMemoryState(StateContract):
    @pytest.fixture
    def clock(self) -> FakeClock:
        return FakeClock()

    @pytest.fixture
    def state(self, clock: FakeClock) -> Iterator[MemoryState]:
        self._clock = clock
        yield MemoryState("t", clock=clock)

    @pytest.fixture
    def other(self, state: MemoryState) -> MemoryState:
        return state  # in-process: both replicas' views are the same object

    async def advance(self, seconds: float) -> None:
        self._clock.now += seconds


async def test_memory_stream_is_trimmed_to_its_maximum_length() -> None:
    state = MemoryState(stream_maxlen=3)
    for n in range(5):
        await state.append_event("i0", n, b"x")
    entries = await state.read_events(STREAM_START, 10, 0)
    assert [e.seq for e in entries] == [2, 3, 4]
    assert await state.oldest_event_id() == entries[0].id
