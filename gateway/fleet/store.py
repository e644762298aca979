"""Where runtime fleet changes live, so that every gateway replica of a pool sees them.

A record per instance id: its settings (`spec`), its `status` (`active`, `draining`,
`removed`) and when that status was set. The configured instances are the seed; records
override them (a removed configured instance stays removed across restarts until it is
added again). Each write bumps a version counter, so replicas poll one small key and read
the records only when it moved.

`memory`: this process only (a single replica). `redis`: keys `warmgate:{pool}:fleet` (hash
id -> JSON record) and `warmgate:{pool}:fleet:version` beside the rest of the pool's shared
state; a status change is compare-and-set in Lua, so two replicas finishing one drain agree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from contracts.redis_keys import PoolKeys
from router.state.base import StateUnavailableError

Status = Literal["active", "draining", "removed"]
STATUSES = ("active", "draining", "removed")


@dataclass(frozen=True, slots=True)
class FleetRecord:
    id: str
    spec: dict[str, Any]  # InstanceSettings as a plain mapping
    status: Status
    since_s: float  # wall clock of the last status change
    by: str = ""  # the replica that wrote it

    def to_json(self) -> str:
        return json.dumps(
            {"spec": self.spec, "status": self.status, "since_s": self.since_s, "by": self.by},
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, instance_id: str, raw: str | bytes) -> FleetRecord | None:
        try:
            data = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(data, dict) or data.get("status") not in STATUSES:
            return None
        spec = data.get("spec")
        return cls(
            instance_id,
            dict(spec) if isinstance(spec, dict) else {},
            data["status"],
            float(data.get("since_s") or 0.0),
            str(data.get("by") or ""),
        )


class FleetStore(Protocol):
    backend: str
    # whether other replicas change it too (else only this process's own calls do)
    shared: bool

    async def version(self) -> int: ...

    async def records(self) -> dict[str, FleetRecord]: ...

    async def put(self, record: FleetRecord) -> None:
        """Write `record` whatever was there."""

    async def transition(self, instance_id: str, expected: Status, record: FleetRecord) -> bool:
        """Write `record` only if the stored status is still `expected`."""

    async def close(self) -> None: ...


class MemoryFleetStore:
    backend = "memory"
    shared = False

    def __init__(self) -> None:
        self._records: dict[str, FleetRecord] = {}
        self._version = 0

    async def version(self) -> int:
        return self._version

    async def records(self) -> dict[str, FleetRecord]:
        return dict(self._records)

    async def put(self, record: FleetRecord) -> None:
        self._records[record.id] = record
        self._version += 1

    async def transition(self, instance_id: str, expected: Status, record: FleetRecord) -> bool:
        current = self._records.get(instance_id)
        if current is None or current.status != expected:
            return False
        await self.put(record)
        return True

    async def close(self) -> None:
        return None


_PUT = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return redis.call('INCR', KEYS[2])
"""

_TRANSITION = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return 0 end
local ok, cur = pcall(cjson.decode, raw)
if not ok or cur['status'] ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('INCR', KEYS[2])
return 1
"""


class RedisFleetStore:
    backend = "redis"
    shared = True

    def __init__(self, url: str, pool: str, *, timeout_s: float = 0.5) -> None:
        self.url = url
        keys = PoolKeys(pool)
        self._keys = [keys.fleet, keys.fleet_version]
        self._r = aioredis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        self._put = self._r.register_script(_PUT)
        self._transition = self._r.register_script(_TRANSITION)

    async def _call(self, coro: Any) -> Any:
        try:
            return await coro
        except (RedisError, OSError) as exc:
            raise StateUnavailableError(f"redis {self.url}: {exc}") from exc

    async def version(self) -> int:
        v = await self._call(self._r.get(self._keys[1]))
        return int(v or 0)

    async def records(self) -> dict[str, FleetRecord]:
        raw = await self._call(self._r.hgetall(self._keys[0]))
        out: dict[str, FleetRecord] = {}
        for k, v in raw.items():
            iid = k.decode() if isinstance(k, bytes) else str(k)
            record = FleetRecord.from_json(iid, v)
            if record is not None:
                out[iid] = record
        return out

    async def put(self, record: FleetRecord) -> None:
        await self._call(self._put(keys=self._keys, args=[record.id, record.to_json()]))

    async def transition(self, instance_id: str, expected: Status, record: FleetRecord) -> bool:
        args = [instance_id, expected, record.to_json()]
        return bool(int(await self._call(self._transition(keys=self._keys, args=args))))

    async def close(self) -> None:
        await self._r.aclose()
