"""Stored responses for the Responses API's `previous_response_id`.

Each completed response the client let us store (`store` not false) is kept as the whole
conversation it ends: the instructions, the chat messages before it (the chain so far plus
its own input) and its output as an assistant message, with the chain's session key. A request
naming it as `previous_response_id` continues that conversation, so the gateway routes on the
whole prefix while the client sends only the new line.

Two stores, one interface (`ResponseStore`), picked by `build_response_store`:
- `RedisResponseStore` when shared state is Redis (`state.backend: redis`): every replica sees
  every stored response; keys `contracts.redis_keys.PoolKeys.response(id)`, `PX` the TTL;
- `MemoryResponseStore` otherwise: this process only, bounded by `responses.memory_max_bytes`
  (the oldest go first) and the TTL.

Both keep a response `responses.ttl_s` and refuse one over `responses.max_bytes` (not stored:
a later `previous_response_id` to it is unknown, as after its TTL).
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from contracts.errors import StateError
from contracts.redis_keys import PoolKeys
from gateway.config.settings import ResponsesSettings, Settings

log = logging.getLogger("warmgate.responses")

MAX_ID_CHARS = 128  # longer ids are unknown without a lookup


class ResponseStoreUnavailableError(StateError):
    """The response store (Redis) could not be reached."""


@dataclass(frozen=True)
class Conversation:
    """What a stored response continues: the chat messages after the instructions (every turn
    so far, this response's output last) and the chain's session key."""

    instructions: str | None
    messages: list[dict[str, Any]]
    session: str | None = None

    def encode(self) -> bytes:
        return json.dumps(
            {"instructions": self.instructions, "messages": self.messages, "session": self.session}
        ).encode()

    @staticmethod
    def decode(data: bytes) -> Conversation | None:
        """The conversation in `data`, or None when it is not one (an older format)."""
        try:
            obj = json.loads(data)
        except ValueError:
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("messages"), list):
            return None
        instructions = obj.get("instructions")
        session = obj.get("session")
        return Conversation(
            instructions if isinstance(instructions, str) else None,
            [m for m in obj["messages"] if isinstance(m, dict)],
            session if isinstance(session, str) else None,
        )


class ResponseStore(Protocol):
    """Stored responses by id, each for a bounded time."""

    backend: str

    async def get(self, response_id: str) -> bytes | None:
        """The stored bytes, or None when unknown or expired."""
        ...

    async def put(self, response_id: str, data: bytes) -> bool:
        """Store `data` under `response_id`; False when it is over the size limit."""
        ...

    async def aclose(self) -> None: ...


class MemoryResponseStore:
    """This process's stored responses: at most `max_total_bytes` of them (oldest evicted
    first), each for `ttl_s` and at most `max_bytes`."""

    backend = "memory"

    def __init__(
        self,
        ttl_s: float,
        max_bytes: int,
        max_total_bytes: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_bytes = max_bytes
        self.max_total_bytes = max_total_bytes
        self._clock = clock
        self._items: OrderedDict[str, tuple[float, bytes]] = OrderedDict()  # by expiry
        self.total_bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def _drop(self, response_id: str) -> None:
        _, data = self._items.pop(response_id)
        self.total_bytes -= len(data)

    def _expire(self, now: float) -> None:
        while self._items:
            first, (expires, _) = next(iter(self._items.items()))
            if expires > now:
                return
            self._drop(first)

    async def get(self, response_id: str) -> bytes | None:
        now = self._clock()
        self._expire(now)
        found = self._items.get(response_id)
        return None if found is None else found[1]

    async def put(self, response_id: str, data: bytes) -> bool:
        if len(data) > self.max_bytes or len(data) > self.max_total_bytes:
            return False
        now = self._clock()
        self._expire(now)
        if response_id in self._items:
            self._drop(response_id)
        while self.total_bytes + len(data) > self.max_total_bytes:
            self._drop(next(iter(self._items)))
        self._items[response_id] = (now + self.ttl_s, data)  # the TTL is one: last expires last
        self.total_bytes += len(data)
        return True

    async def aclose(self) -> None:
        self._items.clear()
        self.total_bytes = 0


class RedisResponseStore:
    """Stored responses in Redis, shared by the pool's replicas: one string per response,
    expiring after `ttl_s` (the server's clock)."""

    backend = "redis"

    def __init__(
        self, url: str, pool: str, ttl_s: float, max_bytes: int, *, timeout_s: float
    ) -> None:
        self.keys = PoolKeys(pool)
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.max_bytes = max_bytes
        self._r = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry_on_timeout=False,
            health_check_interval=0,
        )

    async def get(self, response_id: str) -> bytes | None:
        try:
            data = await self._r.get(self.keys.response(response_id))
        except (RedisError, OSError) as exc:
            raise ResponseStoreUnavailableError(f"response store: {exc}") from exc
        return data if isinstance(data, bytes) else None

    async def put(self, response_id: str, data: bytes) -> bool:
        if len(data) > self.max_bytes:
            return False
        try:
            await self._r.set(self.keys.response(response_id), data, px=self.ttl_ms)
        except (RedisError, OSError) as exc:
            raise ResponseStoreUnavailableError(f"response store: {exc}") from exc
        return True

    async def aclose(self) -> None:
        await self._r.aclose()


def build_response_store(settings: Settings) -> ResponseStore:
    """Redis when the shared state is, else this process's memory."""
    conf: ResponsesSettings = settings.responses
    state = settings.state
    if state.backend == "redis":
        assert state.redis_url is not None  # the settings validator guarantees it
        return RedisResponseStore(
            state.redis_url, state.pool, conf.ttl_s, conf.max_bytes, timeout_s=conf.timeout_s
        )
    return MemoryResponseStore(conf.ttl_s, conf.max_bytes, conf.memory_max_bytes)


async def load(store: ResponseStore, response_id: str) -> Conversation | None:
    """The conversation stored under `response_id`; None when unknown or expired."""
    if not response_id or len(response_id) > MAX_ID_CHARS:
        return None
    data = await store.get(response_id)
    return None if data is None else Conversation.decode(data)


async def save(store: ResponseStore, response_id: str, conversation: Conversation) -> bool:
    """Store `conversation` under `response_id`; False (logged) when it was not stored: over
    the size limit, or the store unreachable (the answer still goes to the client)."""
    try:
        stored = await store.put(response_id, conversation.encode())
    except ResponseStoreUnavailableError as exc:
        log.warning("response %s not stored: %s", response_id, exc)
        return False
    if not stored:
        log.info("response %s not stored: over responses.max_bytes", response_id)
    return stored
