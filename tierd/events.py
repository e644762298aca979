"""Residency events of one tierd, published through the shared codec (`contracts.kv_events`,
vLLM's KV event format, PROTOCOLS §1).

Events are queued synchronously by the store (no I/O on its path) and flushed as one
`EventBatch` every `flush_interval_s`, in the array encoding. tierd's locations are named
`GPU` (its arena), `ARRAY` and `SNAPSHOT` in its own API; on the wire they carry the mediums of
`contracts.tiers`: the arena is host memory in front of the engine's own cache
(`Medium.CPU`, `Tier.HOST`), the shared array `Medium.ARRAY`, snapshots `Medium.SNAPSHOT`
(both defined once, per level, in `contracts.tiers.TIERD_LEVELS`).
tierd knows a slice's token count, not its token ids: `token_ids` is empty and `block_size`
carries the count (0 when unknown). Each batch goes out on a ZMQ PUB socket (frames: topic,
8-byte big-endian seq from 0, payload) and, when Redis is configured, is XADDed to the pool's
stream (`contracts.redis_keys`, MAXLEN ~). A failed Redis write is counted and dropped, never
retried on the hot path; if publishing stalls, at most `max_pending_events` wait (oldest
dropped, counted).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import redis.asyncio as aioredis
import zmq
from redis.exceptions import RedisError

from contracts.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KvEvent,
    encode_batch,
    encode_frames,
)
from contracts.redis_keys import (
    STREAM_FIELD_BATCH,
    STREAM_FIELD_INSTANCE,
    STREAM_FIELD_SEQ,
    stream_key,
)
from contracts.tiers import TIERD_ARENA, TIERD_ARRAY, TIERD_LEVELS, TIERD_SNAPSHOT

# tierd's own names for where a slice is (its API: lookup, evict, stats): `contracts.tiers`
GPU = TIERD_ARENA.name  # its arena (host memory in front of the engine's cache, or a device arena)
ARRAY = TIERD_ARRAY.name
SNAPSHOT = TIERD_SNAPSHOT.name

# the medium each location carries in KV events
EVENT_MEDIUM = {lv.name: lv.medium for lv in TIERD_LEVELS}

log = logging.getLogger("tierd.events")


class EventPublisher:
    """Queues residency events and publishes them in batches (ZMQ and/or Redis Stream)."""

    def __init__(
        self,
        instance_id: str,
        *,
        endpoint: str | None = None,
        topic: str = "kv-events",
        redis_url: str | None = None,
        pool: str = "default",
        maxlen: int = 100_000,
        flush_interval_s: float = 0.01,
        max_batch_events: int = 256,
        max_pending_events: int = 100_000,
    ) -> None:
        self.instance_id = instance_id
        self.endpoint = endpoint
        self.topic = topic
        self.redis_url = redis_url
        self.key = stream_key(pool)
        self.maxlen = maxlen
        self.flush_interval_s = flush_interval_s
        self.max_batch_events = max_batch_events
        self.max_pending_events = max_pending_events
        self.events_dropped = 0
        self.seq = 0
        self.batches_published = 0
        self.events_published = 0
        self.redis_errors = 0
        self._pending: list[KvEvent] = []
        self._ctx: zmq.Context[Any] | None = None
        self._sock: zmq.Socket[Any] | None = None
        self._redis: aioredis.Redis | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        # One flush at a time: a flush that finds the queue empty must not return while
        # another still has a batch in flight (close() and callers rely on that).
        self._flush_lock = asyncio.Lock()
        self._closing = False

    @property
    def enabled(self) -> bool:
        return self.endpoint is not None or self.redis_url is not None

    async def start(self) -> None:
        if self.endpoint:
            self._ctx = zmq.Context()
            self._sock = self._ctx.socket(zmq.PUB)
            self._sock.setsockopt(zmq.LINGER, 0)
            self._sock.bind(self.endpoint)
        if self.redis_url:
            self._redis = aioredis.Redis.from_url(
                self.redis_url, socket_timeout=2.0, socket_connect_timeout=2.0
            )
        if self.enabled:
            self._task = asyncio.create_task(self._run(), name="tierd-events")

    async def close(self) -> None:
        if self._task is not None:
            # Let the publisher finish the batch it is sending: cancelling it mid-XADD lost
            # that batch (its events had already left the queue).
            self._closing = True
            self._wake.set()
            await self._task
            self._task = None
        await self.flush()
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None

    # -- queueing (synchronous, called by the store) -------------------------------------

    def stored(
        self, medium: str, hashes: list[int], parent: int | None, tokens: int | None
    ) -> None:
        if hashes and self.enabled:
            medium = EVENT_MEDIUM.get(medium, medium)
            self._push(BlockStored(tuple(hashes), parent, (), tokens or 0, None, medium, None))

    def removed(self, medium: str, hashes: list[int]) -> None:
        if hashes and self.enabled:
            self._push(BlockRemoved(tuple(hashes), EVENT_MEDIUM.get(medium, medium)))

    def all_cleared(self) -> None:
        if self.enabled:
            self._push(AllBlocksCleared())

    def _push(self, event: KvEvent) -> None:
        if len(self._pending) >= self.max_pending_events:  # publishing is stuck: shed oldest
            del self._pending[0]
            self.events_dropped += 1
        self._pending.append(event)
        if len(self._pending) >= self.max_batch_events:
            self._wake.set()

    # -- publishing ----------------------------------------------------------------------

    async def _run(self) -> None:
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.flush_interval_s)
            self._wake.clear()
            await self.flush()

    async def flush(self) -> None:
        async with self._flush_lock:
            await self._flush_pending()

    async def _flush_pending(self) -> None:
        while self._pending:
            events = self._pending[: self.max_batch_events]
            del self._pending[: self.max_batch_events]
            payload = encode_batch(EventBatch(time.time(), tuple(events)))
            seq = self.seq
            self.seq += 1
            if self._sock is not None:
                with contextlib.suppress(zmq.Again):
                    self._sock.send_multipart(
                        encode_frames(self.topic, seq, payload), flags=zmq.NOBLOCK
                    )
            if self._redis is not None:
                try:
                    await self._redis.xadd(
                        self.key,
                        {
                            STREAM_FIELD_INSTANCE: self.instance_id,
                            STREAM_FIELD_SEQ: str(seq),
                            STREAM_FIELD_BATCH: payload,
                        },
                        maxlen=self.maxlen,
                        approximate=True,
                    )
                except (RedisError, OSError) as exc:
                    self.redis_errors += 1
                    log.warning("redis event write failed: %s", exc)
            self.batches_published += 1
            self.events_published += len(events)

    def stats(self) -> dict[str, Any]:
        return {
            "endpoint": self.endpoint,
            "redis_stream": self.key if self.redis_url else None,
            "seq": self.seq,
            "batches_published": self.batches_published,
            "events_published": self.events_published,
            "redis_errors": self.redis_errors,
            "events_dropped": self.events_dropped,
            "pending": len(self._pending),
        }
