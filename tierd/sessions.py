"""Which L1 slices are protected because their dialogue was active in its last two turns.

A turn of a session begins with each prefetch hint that carries the session key (the
gateway sends one per routed request); slices put or prefetched with that key join the
session's current turn. A session keeps its last two turns; the slices in them are
protected from L1 eviction. Protection is bounded so it can never wedge the store:
sessions idle longer than `ttl_s` lose it, at most `max_sessions` are tracked (least
recently active dropped first), and the store caps the protected share of L1 (it calls
`shed_oldest` until the protected slices in L1 fit).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable

TURNS_PROTECTED = 2


class _Session:
    __slots__ = ("last_active", "turns")

    def __init__(self, now: float) -> None:
        self.turns: deque[dict[int, None]] = deque([{}], maxlen=TURNS_PROTECTED)
        self.last_active = now


class SessionTracker:
    """Refcounted protection of the slices of each session's last two turns."""

    def __init__(self, ttl_s: float, max_sessions: int, clock: Callable[[], float]) -> None:
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self._clock = clock
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._refs: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def protected_count(self) -> int:
        return len(self._refs)

    def count_protected(self, where: Callable[[int], bool]) -> int:
        """How many protected slices satisfy `where` (e.g. are in L1)."""
        return sum(1 for h in self._refs if where(h))

    def is_protected(self, h: int) -> bool:
        return h in self._refs

    def new_turn(self, session: str) -> None:
        s = self._get(session)
        if len(s.turns) == TURNS_PROTECTED:
            later: set[int] = set().union(*list(s.turns)[1:])
            self._release(set(s.turns[0]) - later)
        s.turns.append({})

    def add(self, session: str, hashes: list[int]) -> None:
        s = self._get(session)
        turn = s.turns[-1]
        for h in hashes:
            if not any(h in t for t in s.turns):
                self._refs[h] = self._refs.get(h, 0) + 1
            turn[h] = None

    def expire(self) -> list[tuple[str, list[int]]]:
        """Drop sessions idle longer than the TTL; return each one's slices (turn order)."""
        cutoff = self._clock() - self.ttl_s
        gone: list[tuple[str, list[int]]] = []
        while self._sessions:
            key, s = next(iter(self._sessions.items()))
            if s.last_active >= cutoff:
                break
            gone.append((key, self._drop(key)))
        return gone

    def shed_oldest(self) -> bool:
        """Drop the least recently active session's protection; False if none is left."""
        if not self._sessions:
            return False
        self._drop(next(iter(self._sessions)))
        return True

    def _get(self, session: str) -> _Session:
        s = self._sessions.get(session)
        now = self._clock()
        if s is None:
            s = _Session(now)
            self._sessions[session] = s
            while len(self._sessions) > self.max_sessions:
                self._drop(next(iter(self._sessions)))
        else:
            self._sessions.move_to_end(session)
            s.last_active = now
        return s

    def _drop(self, key: str) -> list[int]:
        s = self._sessions.pop(key)
        seen: dict[int, None] = {}
        for turn in s.turns:
            seen.update(turn)
        self._release(set(seen))
        return list(seen)

    def _release(self, hashes: set[int]) -> None:
        for h in hashes:
            n = self._refs.get(h, 0) - 1
            if n <= 0:
                self._refs.pop(h, None)
            else:
                self._refs[h] = n
