"""LRU-K eviction (O'Neil et al., 1993) with a retained access history.

`AccessHistory` remembers, for each block hash, its last K access ticks (a logical clock,
one tick per access) and how often it was touched, and keeps that for up to
`max_entries` hashes even after a slice leaves every tier (LRU-K's "retained information"),
so a slice that comes back is not treated as new. The frequency gate reads `count()`.

`LruK` is one tier's eviction order over the hashes that tier holds. The victim is the slice
whose K-th most recent access is oldest (largest backward K-distance); slices touched fewer
than K times have infinite distance and go first, oldest last access first. Order is kept in
a min-heap of (class, tick, version, hash) with lazy invalidation: each touch pushes a fresh
entry and bumps the hash's version, stale entries are skipped when popped, and the heap is
rebuilt when stale entries outnumber live ones 3 to 1.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Iterable


class AccessHistory:
    """Last K access ticks and touch counts per hash, bounded LRU by last access."""

    def __init__(self, k: int = 2, max_entries: int = 1_000_000) -> None:
        self.k = k
        self.max_entries = max_entries
        self._tick = 0
        self._ticks: OrderedDict[int, tuple[int, ...]] = OrderedDict()
        self._counts: dict[int, int] = {}

    def touch(self, h: int) -> int:
        """Record one access; return the hash's touch count."""
        self._tick += 1
        prev = self._ticks.pop(h, ())
        self._ticks[h] = (*prev[-(self.k - 1) :], self._tick) if self.k > 1 else (self._tick,)
        count = self._counts.get(h, 0) + 1
        self._counts[h] = count
        while len(self._ticks) > self.max_entries:
            old, _ = self._ticks.popitem(last=False)
            self._counts.pop(old, None)
        return count

    def count(self, h: int) -> int:
        return self._counts.get(h, 0)

    def priority(self, h: int) -> tuple[int, int]:
        """Sort key for eviction: smaller goes first."""
        ticks = self._ticks.get(h, ())
        if len(ticks) >= self.k:
            return (1, ticks[-self.k])
        return (0, ticks[-1] if ticks else 0)


class LruK:
    """One tier's LRU-K eviction order over the hashes it holds."""

    def __init__(self, history: AccessHistory) -> None:
        self.history = history
        self._version: dict[int, int] = {}
        self._heap: list[tuple[int, int, int, int]] = []

    def __len__(self) -> int:
        return len(self._version)

    def __contains__(self, h: object) -> bool:
        return h in self._version

    def keys(self) -> Iterable[int]:
        return self._version.keys()

    def update(self, h: int) -> None:
        """(Re)position `h` after the history recorded an access, or add it."""
        version = self._version.get(h, 0) + 1
        self._version[h] = version
        cls, tick = self.history.priority(h)
        heapq.heappush(self._heap, (cls, tick, version, h))
        if len(self._heap) > 4 * len(self._version) + 64:
            self._compact()

    def remove(self, h: int) -> None:
        self._version.pop(h, None)

    def victims(self, n: int, skip: Callable[[int], bool] | None = None) -> list[int]:
        """Up to `n` hashes in eviction order, passing over those `skip` protects.

        Nothing is removed: the caller removes each victim once it has been dealt with.
        """
        out: list[int] = []
        kept: list[tuple[int, int, int, int]] = []
        while self._heap and len(out) < n:
            entry = heapq.heappop(self._heap)
            h = entry[3]
            if self._version.get(h) != entry[2]:
                continue
            kept.append(entry)
            if skip is not None and skip(h):
                continue
            out.append(h)
        for entry in kept:
            heapq.heappush(self._heap, entry)
        return out

    def _compact(self) -> None:
        live = [e for e in self._heap if self._version.get(e[3]) == e[2]]
        heapq.heapify(live)
        self._heap = live
