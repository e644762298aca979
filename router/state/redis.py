"""Redis shared state: the `SharedState` protocol for a pool of gateway replicas.

Key names come from `contracts.redis_keys`. Keys all start `warmgate:{pool}:` — the braces
are a Redis Cluster hash tag, so every key of a pool lands on one slot and the multi-key Lua
scripts below stay legal there:

    session:<key>   string, the bound instance, PX = session TTL
    inflight        hash replica -> JSON {instance: count}
    replicas        sorted set replica -> expiry (server ms); expired replicas are pruned
    events          stream of residency batches, fields instance, seq, batch; MAXLEN ~
    snapshot        hash data, stream_id, written_ms
    lock:<name>     string, the owner, PX = lock TTL

Read-modify-write (bind if absent, compare-and-set rebind, publish/prune in-flight, lock
extend/release) runs in Lua, so replicas never interleave inside one. Expiry uses the
server's clock (`TIME`), so replicas' clocks need not agree. Every call is bounded by the
client's socket timeout; any Redis failure surfaces as `StateUnavailableError`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from contracts.redis_keys import STREAM_FIELD_BATCH as F_BATCH
from contracts.redis_keys import STREAM_FIELD_INSTANCE as F_INSTANCE
from contracts.redis_keys import STREAM_FIELD_SEQ as F_SEQ
from contracts.redis_keys import PoolKeys
from router.state.base import ReplicaLoad, Snapshot, StateUnavailableError, StreamEntry

_BIND = """
local v = redis.call('GET', KEYS[1])
if v then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return v end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return ARGV[1]
"""

_REBIND = """
local v = redis.call('GET', KEYS[1])
if v and v ~= ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[3]) return v end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return ARGV[2]
"""

_NOW_MS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

_PUBLISH_INFLIGHT = (
    _NOW_MS
    + """
local ttl = tonumber(ARGV[2])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('ZADD', KEYS[2], now + ttl, ARGV[1])
-- the keys outlive their longest-lived replica, never cut short by a shorter TTL
for i = 1, 2 do
  if redis.call('PTTL', KEYS[i]) < ttl then redis.call('PEXPIRE', KEYS[i], ttl) end
end
return 1
"""
)

_READ_INFLIGHT = (
    _NOW_MS
    + """
local dead = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
for _, r in ipairs(dead) do
  redis.call('HDEL', KEYS[1], r)
  redis.call('ZREM', KEYS[2], r)
end
local out = {}
for _, r in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  local raw = redis.call('HGET', KEYS[1], r)
  if raw then
    table.insert(out, r)
    table.insert(out, raw)
  end
end
return out
"""
)

_LOCK = """
local v = redis.call('GET', KEYS[1])
if not v or v == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""

_UNLOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
"""


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisState:
    backend = "redis"
    shared = True

    def __init__(
        self,
        url: str,
        pool: str = "default",
        *,
        timeout_s: float = 0.25,
        stream_maxlen: int = 100_000,
    ) -> None:
        self.pool = pool
        self.url = url
        self.keys = PoolKeys(pool)  # the key names: contracts.redis_keys
        self._stream_maxlen = stream_maxlen
        common: dict[str, Any] = {
            "socket_connect_timeout": timeout_s,
            "retry_on_timeout": False,
            "health_check_interval": 0,
        }
        self._r = aioredis.Redis.from_url(url, socket_timeout=timeout_s, **common)
        # Blocking stream reads hold a connection for up to block_s: a separate client whose
        # socket timeout is set per call.
        self._blocking = aioredis.Redis.from_url(url, socket_timeout=None, **common)
        self._timeout_s = timeout_s
        self._bind = self._r.register_script(_BIND)
        self._rebind = self._r.register_script(_REBIND)
        self._publish = self._r.register_script(_PUBLISH_INFLIGHT)
        self._read = self._r.register_script(_READ_INFLIGHT)
        self._lock = self._r.register_script(_LOCK)
        self._unlock = self._r.register_script(_UNLOCK)

    def key(self, *parts: str) -> str:
        return self.keys.key(*parts)

    async def ping(self) -> None:
        try:
            await self._r.ping()
        except (RedisError, OSError) as exc:
            raise StateUnavailableError(f"redis {self.url}: {exc}") from exc

    async def close(self) -> None:
        await self._r.aclose()
        await self._blocking.aclose()

    async def _call(self, coro: Any) -> Any:
        try:
            return await coro
        except (RedisError, OSError) as exc:
            raise StateUnavailableError(f"redis {self.url}: {exc}") from exc

    # -- sessions ------------------------------------------------------------------------

    async def bind_session(self, key: str, instance: str, ttl_s: float) -> str:
        v = await self._call(self._bind(keys=[self.keys.session(key)], args=[instance, _ms(ttl_s)]))
        return _text(v)

    async def get_session(self, key: str, ttl_s: float) -> str | None:
        v = await self._call(self._r.getex(self.keys.session(key), px=_ms(ttl_s)))
        return None if v is None else _text(v)

    async def rebind_session(
        self, key: str, expected: str | None, instance: str, ttl_s: float
    ) -> str:
        # An empty `expected` never equals a bound instance id, so an existing binding wins.
        args: list[str | int] = [expected or "", instance, _ms(ttl_s)]
        v = await self._call(self._rebind(keys=[self.keys.session(key)], args=args))
        return _text(v)

    async def unbind_session(self, key: str) -> None:
        await self._call(self._r.delete(self.keys.session(key)))

    # -- in-flight counts ----------------------------------------------------------------

    async def publish_inflight(self, replica: str, counts: Mapping[str, int], ttl_s: float) -> None:
        body = json.dumps({k: int(v) for k, v in counts.items()}, sort_keys=True)
        keys = [self.keys.inflight, self.keys.replicas]
        await self._call(self._publish(keys=keys, args=[replica, _ms(ttl_s), body]))

    async def read_inflight(self) -> list[ReplicaLoad]:
        keys = [self.keys.inflight, self.keys.replicas]
        flat = await self._call(self._read(keys=keys, args=[]))
        out: list[ReplicaLoad] = []
        for i in range(0, len(flat) - 1, 2):
            try:
                raw = json.loads(flat[i + 1])
            except ValueError:
                continue
            if isinstance(raw, dict):
                counts = {str(k): int(v) for k, v in raw.items() if isinstance(v, int | float)}
                out.append(ReplicaLoad(_text(flat[i]), counts))
        return out

    # -- stream --------------------------------------------------------------------------

    async def append_event(self, instance: str, seq: int, batch: bytes) -> str:
        fields: dict[Any, Any] = {F_INSTANCE: instance, F_SEQ: str(seq), F_BATCH: bytes(batch)}
        v = await self._call(
            self._r.xadd(self.keys.events, fields, maxlen=self._stream_maxlen, approximate=True)
        )
        return _text(v)

    async def read_events(self, after: str, count: int, block_s: float) -> list[StreamEntry]:
        client = self._blocking if block_s > 0 else self._r
        call = client.xread(
            {self.keys.events: after},
            count=count,
            block=_ms(block_s) if block_s > 0 else None,
        )
        try:
            reply: Any = await asyncio.wait_for(call, timeout=block_s + self._timeout_s + 0.5)
        except (RedisError, OSError, TimeoutError) as exc:
            raise StateUnavailableError(f"redis {self.url}: {exc!r}") from exc
        out: list[StreamEntry] = []
        for _stream, entries in reply or []:
            for entry_id, fields in entries:
                out.append(_entry(_text(entry_id), fields))
        return out

    async def oldest_event_id(self) -> str | None:
        reply = await self._call(self._r.xrange(self.keys.events, "-", "+", count=1))
        return _text(reply[0][0]) if reply else None

    # -- snapshot and lock ---------------------------------------------------------------

    async def save_snapshot(self, snapshot: Snapshot) -> None:
        mapping: dict[Any, Any] = {
            "data": snapshot.data,
            "stream_id": snapshot.stream_id,
            "written_ms": str(round(snapshot.written_at_s * 1000)),
        }
        await self._call(self._r.hset(self.keys.snapshot, mapping=mapping))

    async def load_snapshot(self) -> Snapshot | None:
        raw = await self._call(self._r.hgetall(self.keys.snapshot))
        if not raw or b"data" not in raw or b"stream_id" not in raw:
            return None
        written = int(raw.get(b"written_ms", b"0") or 0) / 1000
        return Snapshot(bytes(raw[b"data"]), _text(raw[b"stream_id"]), written)

    async def acquire_lock(self, name: str, owner: str, ttl_s: float) -> bool:
        v = await self._call(self._lock(keys=[self.keys.lock(name)], args=[owner, _ms(ttl_s)]))
        return bool(int(v))

    async def release_lock(self, name: str, owner: str) -> None:
        await self._call(self._unlock(keys=[self.keys.lock(name)], args=[owner]))


def _entry(entry_id: str, fields: Mapping[bytes, bytes]) -> StreamEntry:
    """A stream entry; one with missing or garbled fields keeps an empty batch and seq -1
    so the reader counts it as malformed and moves past it."""
    try:
        seq = int(fields.get(F_SEQ.encode(), b"-1"))
    except ValueError:
        seq = -1
    instance = _text(fields.get(F_INSTANCE.encode(), b""))
    return StreamEntry(entry_id, instance, seq, bytes(fields.get(F_BATCH.encode(), b"")))
