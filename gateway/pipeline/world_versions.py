"""Telling a zone's new world version from an ordinary shared prefix (issue 22, item 4). Pure:
no I/O, no clock of its own; `gateway.pipeline.world_replicate` feeds it and acts on it.

Every dispatched request with a session key is observed as its block chain (chained hashes:
equal hash at depth d means an equal prompt up to there). Blocks are remembered with when they
were first seen. A **new version** is a block `n` that
- was first seen less than `window_s` ago, while its parent (the *stem*: the zone's static lore)
  was first seen more than `window_s` ago: something new grew under an established prefix; and
- is reached by `min_sessions` distinct sessions within `window_s` of its first sighting.

An ordinary shared prefix never qualifies: it is old (a system prompt or persona matched for
minutes is not new), and a prompt that is new from its first block has no established stem
(nothing at start-up qualifies for the first `window_s`). A dialogue's own next turn grows
under its previous turn, but only that one session reaches it. The new version's hot prefix is
the chain from the stem down to the deepest block all of those sessions share.

A session whose previous prompt passed the same stem but went on with another block `o`, and
now goes on with `n`, *moved* from `o` to `n`: `o`'s run (as far as the new version's hot part
reaches) is the **superseded** version, the first to be demoted in tierd.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from contracts.errors import ConfigurationError


@dataclass(frozen=True, slots=True)
class Bump:
    """A new version found: warm `chain` on the zone's instances that do not hold it."""

    chain: tuple[int, ...]  # the new version's hot prefix, from the first block
    stem_blocks: int  # how many leading blocks it shares with what came before
    sessions: int  # distinct sessions that reached it within the window
    session: str  # the session whose request completed the count (its body is the warm's)
    zone: tuple[str, ...]  # instances those sessions were on before, and where they went now
    holders: tuple[str, ...]  # instances the new version was routed to
    superseded: tuple[int, ...]  # the old version's blocks past the stem (empty: none moved)


@dataclass(slots=True)
class _Block:
    parent: int | None
    first_seen: float
    sessions: set[str] = field(default_factory=set)
    holders: set[str] = field(default_factory=set)  # instances requests through it went to
    zone: set[str] = field(default_factory=set)  # where its sessions were before
    moved_from: Counter[int] = field(default_factory=Counter)  # o -> sessions that moved
    old_runs: dict[int, tuple[int, ...]] = field(default_factory=dict)  # o -> its run
    fired: bool = False


@dataclass(slots=True)
class _Seen:
    chain: tuple[int, ...]
    instance: str


class VersionWindowError(ConfigurationError, ValueError):
    """A detector window that is not positive, or fewer than 2 sessions to call a version."""


class VersionDetector:
    """See the module docstring. Bounded: `max_blocks` of each chain, `max_entries` blocks and
    `max_sessions` sessions remembered, least recently used forgotten first."""

    def __init__(
        self,
        *,
        window_s: float = 10.0,
        min_sessions: int = 4,
        max_blocks: int = 1024,
        max_entries: int = 200_000,
        max_sessions: int = 50_000,
    ) -> None:
        if window_s <= 0 or min_sessions < 2:
            raise VersionWindowError("window_s must be > 0 and min_sessions >= 2")
        self.window_s = window_s
        self.min_sessions = min_sessions
        self.max_blocks = max_blocks
        self.max_entries = max_entries
        self.max_sessions = max_sessions
        self._blocks: OrderedDict[int, _Block] = OrderedDict()
        self._sessions: OrderedDict[str, _Seen] = OrderedDict()

    def observe(self, chain: Sequence[int], session: str, instance: str, now: float) -> Bump | None:
        """One dispatched request; a `Bump` when it completes a new version's count."""
        chain = tuple(chain[: self.max_blocks])
        prev = self._sessions.pop(session, None)
        self._sessions[session] = _Seen(chain, instance)
        if len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)
        young_from = self._first_young(chain, now)
        self._remember(chain, young_from, now)
        if young_from is None or young_from == 0:
            return None  # nothing new, or nothing established above the new part
        n = self._blocks[chain[young_from]]
        if now - n.first_seen > self.window_s or n.fired:
            return None
        for h in chain[young_from:]:
            b = self._blocks[h]
            if len(b.sessions) < self.min_sessions:
                b.sessions.add(session)
            b.holders.add(instance)
        n.zone.add(instance if prev is None else prev.instance)
        if prev is not None and _moved(prev.chain, chain, young_from):
            old = prev.chain[young_from]
            n.moved_from[old] += 1
            n.old_runs.setdefault(old, prev.chain[young_from:])
        if len(n.sessions) < self.min_sessions:
            return None
        n.fired = True
        return self._bump(chain, young_from, n, session)

    def forget(self, chain: Sequence[int]) -> None:
        """Mark the blocks of an announced version as fired: the implicit path leaves them."""
        for h in chain[: self.max_blocks]:
            b = self._blocks.get(h)
            if b is not None:
                b.fired = True

    def _first_young(self, chain: tuple[int, ...], now: float) -> int | None:
        """Index of the first block not seen before `window_s` ago, None when all are old."""
        blocks = self._blocks
        for i, h in enumerate(chain):
            b = blocks.get(h)
            if b is None or now - b.first_seen < self.window_s:
                return i
        return None

    def _remember(self, chain: tuple[int, ...], young_from: int | None, now: float) -> None:
        blocks = self._blocks
        for i, h in enumerate(chain):
            if h in blocks:
                if young_from is not None and i >= young_from - 1:
                    blocks.move_to_end(h)
                continue
            blocks[h] = _Block(chain[i - 1] if i else None, now)
        # the stem and what is young stay; the oldest unused blocks go first
        while len(blocks) > self.max_entries:
            blocks.popitem(last=False)

    def _bump(self, chain: tuple[int, ...], young_from: int, n: _Block, session: str) -> Bump:
        end = young_from
        while end < len(chain) and len(self._blocks[chain[end]].sessions) >= self.min_sessions:
            end += 1
        superseded: tuple[int, ...] = ()
        if n.moved_from:
            old, _ = n.moved_from.most_common(1)[0]
            superseded = n.old_runs[old][: end - young_from]
        zone = sorted(n.zone | n.holders)
        return Bump(
            chain=chain[:end],
            stem_blocks=young_from,
            sessions=len(n.sessions),
            session=session,
            zone=tuple(zone),
            holders=tuple(sorted(n.holders)),
            superseded=superseded,
        )


def _moved(prev: tuple[int, ...], chain: tuple[int, ...], at: int) -> bool:
    """The session's previous prompt shared the stem (the block before `at`) and went on
    with another block there."""
    return len(prev) > at and prev[at - 1] == chain[at - 1] and prev[at] != chain[at]
