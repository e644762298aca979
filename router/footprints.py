"""Session footprints: how much KV the sessions still in play hold on each instance.

A session's turns follow its KV, so where a session is placed is where its KV stays for
its whole dialogue. Each instance's *working set* is the sum of the footprints of its
active sessions, where a session's footprint is the KV its turns computed there (the
uncached tokens of each turn; a prefix it found cached is someone else's footprint, so
shared world state and personas count once). When a session moves, its footprint starts
again on the new instance and its old copy no longer counts: nothing will read it.

A session is active while idle for less than the time within which sessions usually come
back: the `quantile` of recently observed gaps between a session's turns (learned online,
`default_window_s` until `min_gaps` gaps are seen). Idle longer, it has probably ended and
its KV is what LRU should evict first.

Everything is O(1) amortised per call (the window's quantile is recomputed every
`refresh_every` gaps): sessions sit in last-use order and expire from the front. At most
`max_sessions` are kept (the least recently used are dropped first).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass

from contracts.errors import ConfigurationError


class FootprintParamsError(ConfigurationError, ValueError):
    """A SessionFootprints parameter out of range."""


@dataclass(slots=True)
class _Footprint:
    instance: str
    tokens: int
    last_s: float


class SessionFootprints:
    def __init__(
        self,
        *,
        default_window_s: float = 60.0,
        quantile: float = 0.9,
        min_gaps: int = 32,
        gaps_kept: int = 1024,
        refresh_every: int = 64,
        min_window_s: float = 5.0,
        max_sessions: int = 200_000,
    ) -> None:
        if default_window_s <= 0 or min_window_s <= 0:
            raise FootprintParamsError("windows must be positive")
        if not 0.0 < quantile < 1.0:
            raise FootprintParamsError("quantile must be in (0, 1)")
        if max_sessions <= 0 or gaps_kept <= 0 or refresh_every <= 0:
            raise FootprintParamsError("max_sessions, gaps_kept and refresh_every must be positive")
        self.window_s = default_window_s
        self.quantile = quantile
        self.min_gaps = min_gaps
        self.min_window_s = min_window_s
        self.max_sessions = max_sessions
        self._refresh_every = refresh_every
        self._gaps: deque[float] = deque(maxlen=gaps_kept)
        self._since_refresh = 0
        # sessions in play, least recently used first; and when every session was last seen
        # (kept past its expiry, so a late return still teaches the window its true gap)
        self._active: OrderedDict[str, _Footprint] = OrderedDict()
        self._last_seen: OrderedDict[str, float] = OrderedDict()
        self._working: dict[str, int] = {}

    def working_set(self, instance: str) -> int:
        """Tokens of KV the active sessions hold on `instance` (call `expire` first)."""
        return self._working.get(instance, 0)

    def instances(self) -> list[str]:
        """Instances some active session holds KV on."""
        return list(self._working)

    def footprint(self, session: str) -> tuple[str, int] | None:
        """(instance, tokens) of an active session, None if unknown or ended."""
        fp = self._active.get(session)
        return None if fp is None else (fp.instance, fp.tokens)

    def expire(self, now: float) -> None:
        """Sessions idle for longer than the window have ended: their KV stops counting."""
        active = self._active
        while active:
            fp = next(iter(active.values()))
            if now - fp.last_s <= self.window_s:
                break
            active.popitem(last=False)
            self._drop(fp)

    def record(self, session: str, instance: str, computed_tokens: int, now: float) -> None:
        """A turn of `session` was sent to `instance`, where it computes `computed_tokens`."""
        added = max(0, computed_tokens)
        last = self._last_seen.pop(session, None)
        if last is not None:
            self._note_gap(now - last)
        self._last_seen[session] = now
        while len(self._last_seen) > self.max_sessions:
            self._last_seen.popitem(last=False)
        fp = self._active.pop(session, None)
        if fp is not None and fp.instance != instance:
            self._drop(fp)  # moved: the old copy is no longer read
            fp = None
        if fp is None:
            fp = _Footprint(instance, 0, now)
        fp.tokens += added
        fp.last_s = now
        self._active[session] = fp
        self._working[instance] = self._working.get(instance, 0) + added
        while len(self._active) > self.max_sessions:
            self._drop(self._active.popitem(last=False)[1])
        self.expire(now)

    def _drop(self, fp: _Footprint) -> None:
        left = self._working.get(fp.instance, 0) - fp.tokens
        if left > 0:
            self._working[fp.instance] = left
        else:
            self._working.pop(fp.instance, None)

    def _note_gap(self, gap_s: float) -> None:
        if gap_s < 0 or not math.isfinite(gap_s):
            return
        self._gaps.append(gap_s)
        self._since_refresh += 1
        if len(self._gaps) >= self.min_gaps and self._since_refresh >= self._refresh_every:
            self._since_refresh = 0
            ordered = sorted(self._gaps)
            at = min(len(ordered) - 1, int(self.quantile * len(ordered)))
            self.window_s = max(self.min_window_s, ordered[at])

    def __len__(self) -> int:
        """Active sessions."""
        return len(self._active)
