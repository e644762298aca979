"""In-process shared state: the `SharedState` protocol for a single gateway replica.

Same semantics as the Redis backend (TTLs, set-if-absent bindings, an ID'ed stream trimmed
to a maximum length, a lock with an owner) so the same protocol tests run against both, and
so a single replica behaves exactly like a pool of one. Time comes from an injected clock.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Mapping

from router.state.base import ReplicaLoad, Snapshot, StreamEntry, stream_id_key


class MemoryState:
    backend = "memory"
    shared = False  # in this process only

    def __init__(
        self,
        pool: str = "default",
        *,
        stream_maxlen: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pool = pool
        self._clock = clock
        self._sessions: dict[str, tuple[str, float]] = {}
        self._inflight: dict[str, tuple[dict[str, int], float]] = {}
        self._stream: deque[StreamEntry] = deque(maxlen=stream_maxlen)
        self._next_id = 1
        self._appended = asyncio.Condition()
        self._snapshot: Snapshot | None = None
        self._locks: dict[str, tuple[str, float]] = {}

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        async with self._appended:  # wake blocked readers
            self._appended.notify_all()

    # -- sessions ------------------------------------------------------------------------

    def _live_session(self, key: str) -> str | None:
        entry = self._sessions.get(key)
        if entry is None:
            return None
        if entry[1] <= self._clock():
            del self._sessions[key]
            return None
        return entry[0]

    async def bind_session(self, key: str, instance: str, ttl_s: float) -> str:
        bound = self._live_session(key) or instance
        self._sessions[key] = (bound, self._clock() + ttl_s)
        return bound

    async def get_session(self, key: str, ttl_s: float) -> str | None:
        bound = self._live_session(key)
        if bound is not None:
            self._sessions[key] = (bound, self._clock() + ttl_s)
        return bound

    async def rebind_session(
        self, key: str, expected: str | None, instance: str, ttl_s: float
    ) -> str:
        bound = self._live_session(key)
        if bound is None or bound == expected:
            bound = instance
        self._sessions[key] = (bound, self._clock() + ttl_s)
        return bound

    async def unbind_session(self, key: str) -> None:
        self._sessions.pop(key, None)

    # -- in-flight counts ----------------------------------------------------------------

    async def publish_inflight(self, replica: str, counts: Mapping[str, int], ttl_s: float) -> None:
        self._inflight[replica] = (dict(counts), self._clock() + ttl_s)

    async def read_inflight(self) -> list[ReplicaLoad]:
        now = self._clock()
        for replica in [r for r, (_, exp) in self._inflight.items() if exp <= now]:
            del self._inflight[replica]
        return [ReplicaLoad(r, dict(c)) for r, (c, _) in sorted(self._inflight.items())]

    # -- stream --------------------------------------------------------------------------

    async def append_event(self, instance: str, seq: int, batch: bytes) -> str:
        entry_id = f"{self._next_id}-0"
        self._next_id += 1
        self._stream.append(StreamEntry(entry_id, instance, seq, bytes(batch)))
        async with self._appended:
            self._appended.notify_all()
        return entry_id

    def _after(self, after: str, count: int) -> list[StreamEntry]:
        floor = stream_id_key(after)
        out: list[StreamEntry] = []
        for entry in self._stream:
            if stream_id_key(entry.id) > floor:
                out.append(entry)
                if len(out) >= count:
                    break
        return out

    async def read_events(self, after: str, count: int, block_s: float) -> list[StreamEntry]:
        async with self._appended:
            out = self._after(after, count)
            if out or block_s <= 0:
                return out
            try:
                await asyncio.wait_for(self._appended.wait(), timeout=block_s)
            except TimeoutError:
                return []
            return self._after(after, count)

    async def oldest_event_id(self) -> str | None:
        return self._stream[0].id if self._stream else None

    # -- snapshot and lock ---------------------------------------------------------------

    async def save_snapshot(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot

    async def load_snapshot(self) -> Snapshot | None:
        return self._snapshot

    async def acquire_lock(self, name: str, owner: str, ttl_s: float) -> bool:
        now = self._clock()
        held = self._locks.get(name)
        if held is not None and held[1] > now and held[0] != owner:
            return False
        self._locks[name] = (owner, now + ttl_s)
        return True

    async def release_lock(self, name: str, owner: str) -> None:
        held = self._locks.get(name)
        if held is not None and held[0] == owner:
            del self._locks[name]
