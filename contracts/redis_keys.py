"""Shared-state key names in Redis, one place for every writer and reader.

Every key of a pool starts `warmgate:{<pool>}:`; the braces are a Redis Cluster hash tag, so
one pool's keys share a slot and multi-key Lua scripts work on a cluster. The residency event
stream is `warmgate:{<pool>}:events`; each entry has the fields `instance` (publisher id),
`seq` (its batch sequence number, decimal) and `batch` (the msgpack `EventBatch` payload,
exactly as on the ZMQ wire, see `contracts.kv_events`).
"""

from __future__ import annotations

STREAM_FIELD_INSTANCE = "instance"
STREAM_FIELD_SEQ = "seq"
STREAM_FIELD_BATCH = "batch"


class PoolKeys:
    """The key names of one pool."""

    __slots__ = ("pool", "prefix")

    def __init__(self, pool: str) -> None:
        self.pool = pool
        self.prefix = f"warmgate:{{{pool}}}:"

    def key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    @property
    def events(self) -> str:
        """The residency event stream."""
        return self.key("events")

    @property
    def snapshot(self) -> str:
        """The index snapshot a new replica bootstraps from."""
        return self.key("snapshot")

    @property
    def inflight(self) -> str:
        return self.key("inflight")

    @property
    def replicas(self) -> str:
        return self.key("replicas")

    def session(self, session_key: str) -> str:
        return self.key("session", session_key)

    def lock(self, name: str) -> str:
        return self.key("lock", name)

    @property
    def fleet(self) -> str:
        """Runtime fleet changes, a hash id -> JSON record (gateway/fleet/store.py)."""
        return self.key("fleet")

    @property
    def fleet_version(self) -> str:
        """Bumped by every fleet write, so replicas poll one small key."""
        return self.key("fleet", "version")

    def rate_limit(self, bucket: str) -> str:
        """A token bucket of the limits (gateway/http/limits.py), e.g. `player:r:<id>`."""
        return self.key("rl", bucket)

    def response(self, response_id: str) -> str:
        """A stored Responses API response (gateway/pipeline/response_store.py)."""
        return self.key("response", response_id)


def stream_key(pool: str) -> str:
    """The residency event stream of `pool`."""
    return PoolKeys(pool).events
