"""Which blocks the engine beside tierd holds in its own device cache, as its KV events say.

The engine asks tierd only for the blocks past its own cached prefix, so a prefetch that
reads the leading blocks the engine already holds spends the array's bandwidth (and, on a
shared machine, the engine's CPU) on blocks nobody will ask for, ahead of the ones that
will be asked for. `held_prefix` tells the prefetcher how many to pass over. Events lag
the engine by milliseconds; a block evicted meanwhile is simply asked for and read then.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from tierd.chain_lookup import leading_run

DEFAULT_CAPACITY = 1 << 20  # blocks remembered; far above any engine's device cache here


class EngineResidency:
    """The engine's device-resident block hashes (oldest forgotten first past capacity)."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self._held: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, h: object) -> bool:
        return h in self._held

    def stored(self, hashes: Iterable[int]) -> None:
        for h in hashes:
            self._held[h] = None
            self._held.move_to_end(h)
        while len(self._held) > self.capacity:
            self._held.popitem(last=False)

    def removed(self, hashes: Iterable[int]) -> None:
        for h in hashes:
            self._held.pop(h, None)

    def cleared(self) -> None:
        self._held.clear()

    def held_prefix(self, chain: list[int]) -> int:
        """How many leading blocks of `chain` the engine holds."""
        return leading_run(chain, self._held.__contains__)
