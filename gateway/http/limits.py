"""Rate limits per API key (a game server, a studio) and per player (session key), as token
buckets: requests per second and prompt tokens per minute (estimated, 4 characters a token,
before any tokenizer). A request takes from every bucket that applies or from none
(all-or-nothing), so a refused request costs nothing.

With `state.backend: redis` the buckets live in Redis and one Lua script reads, refills
and takes them atomically on the server's clock: every replica enforces the same budget.
Otherwise (or while Redis is unreachable) they live in this replica's memory.

Over the limit: 429 in the OpenAI shape (`type` `requests` or `tokens`, code
`rate_limit_exceeded`) with `Retry-After`, `retry-after-ms` (the SDK waits that long before
its retry) and `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from contracts.redis_keys import PoolKeys
from gateway.config.guards import BucketSettings, LimitSettings
from gateway.config.settings import Settings
from gateway.errors import OpenAIError
from gateway.http.access import presented_key
from gateway.pipeline.parse import ParsedRequest

log = logging.getLogger("warmgate.limits")


@dataclass(frozen=True, slots=True)
class Take:
    """Take `cost` from bucket `key` (refilled at `rate` per second up to `capacity`)."""

    key: str
    family: str  # "requests" or "tokens"
    rate: float
    capacity: float
    cost: float


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool
    wait_s: float  # until every bucket could pay (0 when allowed)
    levels: tuple[float, ...]  # each bucket's tokens after the take (before, if refused)


def _takes(settings: BucketSettings, scope: str, ident: str, tokens: int) -> list[Take]:
    out: list[Take] = []
    if settings.requests_per_s is not None:
        rate = settings.requests_per_s
        burst = settings.burst if settings.burst is not None else max(1.0, rate)
        out.append(Take(f"{scope}:r:{ident}", "requests", rate, burst, 1.0))
    if settings.prompt_tokens_per_min is not None:
        cap = float(settings.prompt_tokens_per_min)
        # one prompt larger than the whole budget takes all of it, rather than never passing
        out.append(Take(f"{scope}:t:{ident}", "tokens", cap / 60.0, cap, min(cap, tokens)))
    return out


class MemoryBuckets:
    """Buckets of one replica; the least recently used are forgotten past `max_keys`
    (forgetting one only refills it early)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, max_keys: int = 100_000):
        self._clock = clock
        self._max = max_keys
        self._state: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, at

    async def take(self, takes: Sequence[Take]) -> Verdict:
        now = self._clock()
        levels: list[float] = []
        wait = 0.0
        for t in takes:
            tokens, at = self._state.get(t.key, (t.capacity, now))
            tokens = min(t.capacity, tokens + (now - at) * t.rate)
            levels.append(tokens)
            if tokens < t.cost:
                wait = max(wait, (t.cost - tokens) / t.rate)
        if wait > 0:
            return Verdict(False, wait, tuple(levels))
        after = []
        for t, level in zip(takes, levels, strict=True):
            left = level - t.cost
            self._state[t.key] = (left, now)
            self._state.move_to_end(t.key)
            after.append(left)
        while len(self._state) > self._max:
            self._state.popitem(last=False)
        return Verdict(True, 0.0, tuple(after))


_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local n = #KEYS
local levels = {}
local wait = 0
for i = 1, n do
  local rate = tonumber(ARGV[3 * i - 2])
  local cap = tonumber(ARGV[3 * i - 1])
  local cost = tonumber(ARGV[3 * i])
  local v = redis.call('HMGET', KEYS[i], 't', 'at')
  local tok = tonumber(v[1]) or cap
  local at = tonumber(v[2]) or now
  tok = math.min(cap, tok + math.max(0, now - at) * rate)
  levels[i] = tok
  if tok < cost then
    local w = (cost - tok) / rate
    if w > wait then wait = w end
  end
end
local out = {}
if wait > 0 then
  out[1] = 0
  out[2] = tostring(wait)
  for i = 1, n do out[i + 2] = tostring(levels[i]) end
  return out
end
out[1] = 1
out[2] = '0'
for i = 1, n do
  local rate = tonumber(ARGV[3 * i - 2])
  local cap = tonumber(ARGV[3 * i - 1])
  local left = levels[i] - tonumber(ARGV[3 * i])
  redis.call('HSET', KEYS[i], 't', tostring(left), 'at', tostring(now))
  redis.call('PEXPIRE', KEYS[i], math.ceil((cap - left) / rate) + 1000)
  out[i + 2] = tostring(left)
end
return out
"""


class RedisBuckets:
    """The same buckets in Redis (rates in the script are per millisecond)."""

    def __init__(self, url: str, pool: str, timeout_s: float = 0.25) -> None:
        import redis.asyncio as aioredis

        self._redis = aioredis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        self._script = self._redis.register_script(_SCRIPT)
        self._keys = PoolKeys(pool)

    async def take(self, takes: Sequence[Take]) -> Verdict:
        args: list[float] = []
        for t in takes:
            args += [t.rate / 1000.0, t.capacity, t.cost]
        raw: list[Any] = await self._script(
            keys=[self._keys.rate_limit(t.key) for t in takes], args=args
        )
        wait_ms = float(raw[1])
        levels = tuple(float(x) for x in raw[2:])
        return Verdict(bool(int(raw[0])), wait_ms / 1000.0, levels)

    async def aclose(self) -> None:
        await self._redis.aclose()


class Limiter:
    """Decides, per request, whether its key and its player may go on."""

    def __init__(
        self, settings: LimitSettings, shared: RedisBuckets | None, chars_per_token: int = 4
    ) -> None:
        self.settings = settings
        self.shared = shared
        self.local = MemoryBuckets()
        self._chars_per_token = chars_per_token
        self._shared_down = False

    @property
    def enabled(self) -> bool:
        return self.settings.per_key.enabled or self.settings.per_player.enabled

    def takes_for(self, key: bytes | None, parsed: ParsedRequest) -> list[Take]:
        tokens = max(1, len(parsed.prompt_text) // self._chars_per_token)
        ident = hashlib.sha256(key).hexdigest()[:32] if key else "anonymous"
        takes = _takes(self.settings.per_key, "key", ident, tokens)
        if parsed.session_key:
            player = hashlib.sha256(parsed.session_key.encode()).hexdigest()[:32]
            takes += _takes(self.settings.per_player, "player", player, tokens)
        return takes

    async def check(self, key: bytes | None, parsed: ParsedRequest) -> None:
        """Raise the 429 when any bucket is short; otherwise the request has paid."""
        takes = self.takes_for(key, parsed)
        if not takes:
            return
        verdict = await self._take(takes)
        if not verdict.allowed:
            raise too_many(takes, verdict)

    async def _take(self, takes: Sequence[Take]) -> Verdict:
        if self.shared is not None:
            try:
                verdict = await self.shared.take(takes)
            except Exception as exc:  # any Redis failure: this replica's own buckets
                if not self._shared_down:
                    log.warning("rate limits from local state: Redis failed (%s)", type(exc))
                    self._shared_down = True
            else:
                if self._shared_down:
                    log.info("rate limits shared through Redis again")
                    self._shared_down = False
                return verdict
        return await self.local.take(takes)

    async def aclose(self) -> None:
        if self.shared is not None:
            await self.shared.aclose()


def _reset(seconds: float) -> str:
    """OpenAI's reset format: `1s`, `6m0s`, `250ms`."""
    if seconds < 1:
        return f"{max(1, round(seconds * 1000))}ms"
    whole = math.ceil(seconds)
    minutes, secs = divmod(whole, 60)
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def too_many(takes: Sequence[Take], verdict: Verdict) -> OpenAIError:
    headers = {
        "retry-after": str(max(1, math.ceil(verdict.wait_s))),
        "retry-after-ms": str(max(1, math.ceil(verdict.wait_s * 1000))),
    }
    pairs = list(zip(takes, verdict.levels, strict=True))
    for family in ("requests", "tokens"):
        mine = [(t, lv) for t, lv in pairs if t.family == family]
        if mine:  # the fullest-used bucket of the family speaks for it
            t, level = min(mine, key=lambda p: p[1] / p[0].capacity)
            headers[f"x-ratelimit-limit-{family}"] = str(int(t.capacity))
            headers[f"x-ratelimit-remaining-{family}"] = str(max(0, int(level)))
            headers[f"x-ratelimit-reset-{family}"] = _reset((t.capacity - level) / t.rate)
    short, _ = max(pairs, key=lambda p: (p[0].cost - p[1]) / p[0].rate)
    who = "player" if short.key.startswith("player:") else "key"
    what = "requests per second" if short.family == "requests" else "prompt tokens per minute"
    return OpenAIError(
        429,
        f"Rate limit reached for {what} of this {who}; retry in {verdict.wait_s:.2f} s.",
        type=short.family,
        code="rate_limit_exceeded",
        headers=headers,
    )


async def enforce(limiter: Limiter, request: Request, parsed: ParsedRequest) -> None:
    """The rate-limit step of serving a completion (a no-op without limits)."""
    if limiter.enabled:
        await limiter.check(presented_key(request), parsed)


def build_limiter(settings: Settings) -> Limiter:
    """The app's limiter (its buckets in Redis when the state is shared), built with the state."""
    st = settings.state
    shared = None
    if st.backend == "redis" and st.redis_url:
        shared = RedisBuckets(st.redis_url, st.pool)
    return Limiter(settings.limits, shared, settings.routing.chars_per_token)
