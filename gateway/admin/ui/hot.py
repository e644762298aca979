"""The hottest sessions and prefixes, and the cached tokens the router predicted by tier:
fed by `Router.dispatch_observers` on every dispatch, read by the operator page.

Counts decay exponentially (`half_life_s`), so "hot" means hot lately, and each table is
bounded (`max_keys`, 2,000; the coldest half is dropped when it fills). A prefix is named by the
hash of a request's first blocks (the chain hash of the last of them), so
the requests it counts share at least that many leading blocks: an NPC's persona and
world state, typically. `prefix_tokens` (256) is rounded up to whole blocks of the request's
own block size (64 approximate, the engines' in precise mode)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from contracts.slices import normalize
from router.types import Decision, RouteRequest


@dataclass(slots=True)
class _Heat:
    score: float = 0.0
    at: float = 0.0
    requests: int = 0
    instance: str = ""
    tokens: int = 0
    sessions: set[str] = field(default_factory=set)


# The page shows the 10 hottest of each table. A prefix key is per conversation start when
# the shared text is shorter than `prefix_tokens`, so at a game's request rate a 10,000-key
# table took ~25 minutes to fill (the soak's gateway RSS grew until then, ~450 B a key); at
# 2,000 it is full within minutes and pruning keeps the hot half.
MAX_KEYS = 2_000


class HotTracker:
    def __init__(
        self,
        *,
        half_life_s: float = 120.0,
        prefix_tokens: int = 256,
        max_keys: int = MAX_KEYS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._rate = math.log(2) / half_life_s
        self.prefix_tokens = prefix_tokens
        self.max_keys = max_keys
        self._clock = clock
        self.sessions: dict[str, _Heat] = {}
        self.prefixes: dict[int, _Heat] = {}
        self.predicted_by_tier: dict[str, int] = {}  # cumulative, for the page's history
        self.routed_prompt_tokens = 0

    def _bump(self, table: dict[Any, _Heat], key: Any, now: float) -> _Heat:
        heat = table.get(key)
        if heat is None:
            if len(table) >= self.max_keys:
                self._prune(table, now)
            heat = table[key] = _Heat(at=now)
        heat.score = heat.score * math.exp(-self._rate * (now - heat.at)) + 1.0
        heat.at = now
        heat.requests += 1
        return heat

    def _prune(self, table: dict[Any, _Heat], now: float) -> None:
        ranked = sorted(table, key=lambda k: self._score(table[k], now))
        for key in ranked[: len(ranked) // 2]:
            del table[key]

    def _score(self, heat: _Heat, now: float) -> float:
        return heat.score * math.exp(-self._rate * (now - heat.at))

    def observe(self, rr: RouteRequest, decision: Decision, instance: str) -> None:
        now = self._clock()
        self.routed_prompt_tokens += rr.prompt_tokens
        by_tier = (
            decision.cached_tokens_by_tier
            if instance == decision.instance
            else next(
                (c.cached_tokens_by_tier for c in decision.candidates if c.instance == instance),
                {},
            )
        )
        for tier, n in by_tier.items():
            self.predicted_by_tier[tier] = self.predicted_by_tier.get(tier, 0) + n
        if rr.session_key:
            heat = self._bump(self.sessions, rr.session_key, now)
            heat.instance, heat.tokens = instance, rr.prompt_tokens
        blocks = max(1, -(-self.prefix_tokens // max(1, rr.block_tokens)))
        if len(rr.block_hashes) >= blocks:
            key = rr.block_hashes[blocks - 1]
            heat = self._bump(self.prefixes, key, now)
            heat.instance, heat.tokens = instance, blocks * rr.block_tokens
            if rr.session_key and len(heat.sessions) < 1000:
                heat.sessions.add(rr.session_key)

    def top(self, n: int = 10) -> dict[str, list[dict[str, Any]]]:
        now = self._clock()

        def rows(table: dict[Any, _Heat], name: Callable[[Any], str]) -> list[dict[str, Any]]:
            ranked = sorted(table.items(), key=lambda kv: -self._score(kv[1], now))[:n]
            return [
                {
                    "key": name(k),
                    "heat": round(self._score(h, now), 3),
                    "requests": h.requests,
                    "last_instance": h.instance,
                    "tokens": h.tokens,
                    "sessions": len(h.sessions),
                    "seconds_ago": round(now - h.at, 1),
                }
                for k, h in ranked
            ]

        return {
            "sessions": rows(self.sessions, str),
            "prefixes": rows(self.prefixes, lambda h: f"{normalize(h):016x}"),
        }
