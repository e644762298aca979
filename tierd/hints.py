"""Was the prefetch on time? What a hint asked for, checked when the engine asks for it.

The gateway hints a request's block chain (in the engine's hashes) to the tierd of the
instance it routes to, before the engine sees the request (`tierd.prefetch`). The engine's
connector then looks up the blocks past its own prefix cache (`tierd.kvserver`). For each
hinted block that the engine asks tierd for, the first time it does: was it in tierd's
host memory (L1) by then (``on_time``) or still elsewhere — the array, a snapshot, or being
read (``late``)? Blocks the engine never asks for (its own cache had them) are not counted,
nor is an ask more than `ttl_s` after the hint (a later turn's, not this hint's). A hint
that arrives within `race_s` after the engine already asked for its blocks (the gateway
sends it beside the request, not before it) is ``late`` for those blocks. Only the first ask
of a request counts: vLLM asks again each time it retries a waiting request, and such a
re-ask (the connector names the request) is neither a new ask nor, for the next turn's hint,
an ask that came first.
The on-time share is ``on_time / (on_time + late)``; `bench compare --tiers` reports it.
Why a block was late shows in the other counters: ``evicted_before_ask`` (it was in host
memory and L1 evicted it while its ask was still to come), ``late_absent_at_hint`` (no tier
held it when the hint came: it was written later, by a save or a peer sharing the array, so
no prefetch could have fetched it), ``late_hint_after_ask`` (the engine asked first); the rest
of ``late`` were still being read when asked. The prefetches' own outcomes are
`tierd.prefetch`'s.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

DEFAULT_CAPACITY = 1 << 17  # hinted blocks remembered (oldest forgotten first)
DEFAULT_TTL_S = 30.0  # a hint answers for the engine's asks this long
# An unhinted ask this recent is the hinted request's own (the hint raced it); an older one
# was another request's (a turn routed without a hint), and the hint waits for a new ask.
DEFAULT_RACE_S = 2.0


class HintLedger:
    """Hinted blocks awaiting the engine's first ask, and the outcome counts."""

    def __init__(
        self,
        capacity: int = DEFAULT_CAPACITY,
        ttl_s: float = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.monotonic,
        race_s: float = DEFAULT_RACE_S,
    ) -> None:
        self.capacity = capacity
        self.ttl_s = ttl_s
        self.race_s = race_s
        self._clock = clock
        self._pending: OrderedDict[int, float] = OrderedDict()  # hash -> when hinted
        self._asked: OrderedDict[int, float] = OrderedDict()  # hash -> when asked, unhinted
        self._asker: OrderedDict[int, str] = OrderedDict()  # hash -> the request that last asked
        self._absent: set[int] = set()  # pending hints no tier held when they came
        self.counters: Counter[str] = Counter()

    def hinted(self, hashes: Iterable[int]) -> None:
        now = self._clock()
        for h in hashes:
            asked = self._asked.pop(h, None)
            if asked is not None and now - asked <= self.race_s:
                self.counters["hinted_blocks"] += 1
                self.counters["late"] += 1  # the engine asked before the hint came
                self.counters["late_hint_after_ask"] += 1
                continue
            if h in self._pending:
                self._pending.move_to_end(h)
            else:
                self.counters["hinted_blocks"] += 1
            self._pending[h] = now
        while len(self._pending) > self.capacity:
            old, _ = self._pending.popitem(last=False)
            self._absent.discard(old)
            self.counters["hinted_forgotten"] += 1

    def absent(self, hashes: Iterable[int]) -> None:
        """Of the hashes just hinted, these were in no tier (the prefetch found nothing)."""
        self._absent.update(h for h in hashes if h in self._pending)

    def awaiting(self, h: int) -> bool:
        """Hinted within the TTL and not yet asked for by the engine."""
        at = self._pending.get(h)
        return at is not None and self._clock() - at <= self.ttl_s

    def evicted(self, hashes: Iterable[int]) -> None:
        """L1 freed these: count those whose ask is still to come (they will be late)."""
        self.counters["evicted_before_ask"] += sum(1 for h in hashes if self.awaiting(h))

    def asked(
        self, hashes: Iterable[int], in_host: Callable[[int], bool], request: str | None = None
    ) -> None:
        """The engine asks for `hashes` (tierd holds them in some tier), for `request` when
        the connector names it (then its retries are not asks of their own)."""
        now = self._clock()
        for h in hashes:
            if request is not None:
                if self._asker.get(h) == request:
                    self.counters["reasked"] += 1  # vLLM retried the waiting request
                    continue
                self._asker[h] = request
                self._asker.move_to_end(h)
            at = self._pending.pop(h, None)
            if at is None:
                self._asked[h] = now
                self._asked.move_to_end(h)
                continue
            absent = h in self._absent
            self._absent.discard(h)
            if now - at > self.ttl_s:
                self.counters["hint_expired"] += 1
            elif in_host(h):
                self.counters["on_time"] += 1
            else:
                self.counters["late"] += 1
                self.counters["late_absent_at_hint"] += absent
        for remembered in (self._asked, self._asker):
            while len(remembered) > self.capacity:
                remembered.popitem(last=False)

    def stats(self) -> dict[str, Any]:
        asked = self.counters["on_time"] + self.counters["late"]
        return {
            **{f"prefetch_{k}": v for k, v in self.counters.items()},
            "prefetch_on_time_share": round(self.counters["on_time"] / asked, 4) if asked else None,
        }
