"""session: consistent hashing of the session key with bounded load.

Each candidate instance owns `vnodes` points on a 64-bit ring (xxh3 of "instance#k"). A
request's session key hashes to a point; walking the ring clockwise from it, the first
instance that is not overloaded wins ("consistent hashing with bounded loads", Mirrokni et
al. 2018): with `n` candidates and `m` requests in flight, an instance may hold at most
`ceil((m + 1) / n * (1 + eps))` after taking this one, so it is skipped when its in-flight
count + 1 exceeds that. Adding or removing an instance moves only the keys next to its
points. A request without a session key goes to the least loaded instance.
Fallbacks: the next distinct instances along the ring.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

import xxhash

from router.errors import PolicyConfigError
from router.policies.base import InstanceView, Policy
from router.policies.scoring import make_decision, rank_by_load
from router.types import Decision, RouteRequest


class _Ring:
    __slots__ = ("owners", "points")

    def __init__(self, instances: Sequence[str], vnodes: int) -> None:
        pairs = sorted(
            (xxhash.xxh3_64_intdigest(f"{inst}#{k}".encode()), inst)
            for inst in instances
            for k in range(vnodes)
        )
        self.points = [p for p, _ in pairs]
        self.owners = [i for _, i in pairs]

    def walk(self, key: str) -> list[str]:
        """Distinct instances clockwise from the key's point."""
        start = bisect.bisect_right(self.points, xxhash.xxh3_64_intdigest(key.encode()))
        seen: dict[str, None] = {}
        n = len(self.points)
        distinct = len(set(self.owners))
        for k in range(n):
            inst = self.owners[(start + k) % n]
            if inst not in seen:
                seen[inst] = None
                if len(seen) == distinct:
                    break
        return list(seen)


class SessionPolicy(Policy):
    name = "session"

    def __init__(self, *, vnodes: int = 160, eps: float = 0.25) -> None:
        if vnodes <= 0:
            raise PolicyConfigError("vnodes must be positive")
        if eps < 0:
            raise PolicyConfigError("eps must be >= 0")
        self.vnodes = vnodes
        self.eps = eps
        self._ring_key: tuple[str, ...] = ()
        self._ring: _Ring | None = None

    def _ring_for(self, candidates: Sequence[InstanceView]) -> _Ring:
        key = tuple(sorted(v.id for v in candidates))
        if self._ring is None or key != self._ring_key:
            self._ring = _Ring(key, self.vnodes)
            self._ring_key = key
        return self._ring

    def choose(self, request: RouteRequest, candidates: Sequence[InstanceView]) -> Decision:
        if not request.session_key:
            ranked = rank_by_load(candidates)
            return make_decision(
                request, self.name, "no session key: least loaded", ranked, candidates
            )
        by_id = {v.id: v for v in candidates}
        order = [by_id[i] for i in self._ring_for(candidates).walk(request.session_key)]
        total = sum(v.in_flight for v in candidates)
        cap = math.ceil((total + 1) / len(candidates) * (1 + self.eps))
        home = order[0]
        for k, view in enumerate(order):
            if view.in_flight + 1 <= cap:
                ranked = order[k:] + order[:k]
                if view is home:
                    reason = "session home on the hash ring"
                else:
                    reason = f"session home {home.id} over load bound {cap}: next on the ring"
                return make_decision(request, self.name, reason, ranked, candidates)
        # unreachable in practice (someone is always at or below the average)
        return make_decision(
            request, self.name, "all over bound: least loaded", rank_by_load(order), candidates
        )
