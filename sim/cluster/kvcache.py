"""KV block stores of the cluster simulator: an L1 (HBM) store with pinning, and plain LRU
stores for the slower tiers (an instance's L2, the shared array).

L1 holds blocks by id. A block used by a running request is pinned (reference counted)
and cannot be evicted; unpinned blocks sit in an LRU list. Capacity is counted in blocks:
resident (pinned + LRU) plus `reserved` (blocks promised to admitted requests whose
prefill has not finished, and their private output blocks) never exceeds it, except
when a single request larger than the whole store runs alone.

When a request finishes its chain is unpinned tail first, so the tail is the least
recently used and the shared head (system prompt, world state) the most: the same order
vLLM's free-block queue gives. Evicted blocks are handed to a `demote` callback, which
writes them down to the next tier.

Slow tiers are inclusive: loading a block into L1 leaves the copy where it was.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

from contracts.errors import ConfigurationError


class CacheCapacityError(ConfigurationError, ValueError):
    """A simulated KV store sized below what it must hold."""


class LruStore:
    """A capacity-bounded LRU set of block ids; evicted ids go to `on_evict`."""

    def __init__(self, capacity_blocks: int, on_evict: Callable[[int], None]) -> None:
        if capacity_blocks < 0:
            raise CacheCapacityError("capacity must be >= 0")
        self.capacity = capacity_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self._on_evict = on_evict
        self.evictions = 0

    def __contains__(self, block: int) -> bool:
        return block in self._blocks

    def __len__(self) -> int:
        return len(self._blocks)

    def put(self, block: int) -> bool:
        """Insert or refresh `block`; returns True when it was not there before."""
        if self.capacity == 0:
            return False
        if block in self._blocks:
            self._blocks.move_to_end(block)
            return False
        self._blocks[block] = None
        while len(self._blocks) > self.capacity:
            old, _ = self._blocks.popitem(last=False)
            self.evictions += 1
            self._on_evict(old)
        return True

    def touch(self, block: int) -> None:
        if block in self._blocks:
            self._blocks.move_to_end(block)


class L1Store:
    """HBM blocks of one instance: pinned blocks, an LRU of unpinned ones, reservations."""

    def __init__(self, capacity_blocks: int, demote: Callable[[int], None]) -> None:
        if capacity_blocks <= 0:
            raise CacheCapacityError("L1 capacity must be at least one block")
        self.capacity = capacity_blocks
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._pins: dict[int, int] = {}
        self.reserved = 0
        self._demote = demote
        self.evictions = 0

    def __contains__(self, block: int) -> bool:
        return block in self._pins or block in self._lru

    @property
    def resident(self) -> int:
        return len(self._pins) + len(self._lru)

    @property
    def free(self) -> int:
        return self.capacity - self.resident - self.reserved

    @property
    def evictable(self) -> int:
        return len(self._lru)

    def leading_match(self, chain: Sequence[int]) -> int:
        """How many leading blocks of `chain` are resident."""
        n = 0
        for block in chain:
            if block in self._pins or block in self._lru:
                n += 1
            else:
                break
        return n

    def make_room(self, blocks: int, *, force: bool = False) -> bool:
        """Evict LRU blocks until `blocks` more fit. False (nothing evicted) if they cannot,
        unless `force`, which evicts all it can and lets the store run over capacity."""
        if self.free >= blocks:
            return True
        if not force and self.free + len(self._lru) < blocks:
            return False
        while self.free < blocks and self._lru:
            old, _ = self._lru.popitem(last=False)
            self.evictions += 1
            self._demote(old)
        return self.free >= blocks or force

    def admit(self, matched: Sequence[int], need: int, *, force: bool = False) -> bool:
        """Pin the resident `matched` blocks and make room for `need` more, or do nothing and
        return False when they cannot fit (unless `force`: see `make_room`)."""
        lru = self._lru
        in_lru = sum(1 for block in matched if block in lru)
        if not force and self.free + len(lru) - in_lru < need:
            return False
        self.pin(matched)
        self.make_room(need, force=True)
        return True

    def pin(self, chain: Iterable[int]) -> None:
        """Pin resident blocks (each call must be matched by one `unpin`)."""
        pins, lru = self._pins, self._lru
        for block in chain:
            count = pins.get(block)
            if count is None:
                del lru[block]  # KeyError if the caller pins a block that is not resident
                pins[block] = 1
            else:
                pins[block] = count + 1

    def insert_pinned(self, chain: Iterable[int]) -> list[int]:
        """Make blocks resident and pinned (after their KV was computed or loaded);
        returns the ids that were not resident before. Room must have been made."""
        new: list[int] = []
        pins, lru = self._pins, self._lru
        for block in chain:
            count = pins.get(block)
            if count is not None:
                pins[block] = count + 1
            elif block in lru:
                del lru[block]
                pins[block] = 1
            else:
                pins[block] = 1
                new.append(block)
        return new

    def insert_cached(self, chain: Sequence[int]) -> list[int]:
        """Make blocks resident and unpinned, most recently used, evicting others as needed
        (a prefetch landing in HBM); returns the ids that were not resident before."""
        new: list[int] = []
        for block in reversed(chain):  # head ends most recent
            if block in self._pins:
                continue
            if block in self._lru:
                self._lru.move_to_end(block)
                continue
            if not self.make_room(1):
                break
            self._lru[block] = None
            new.append(block)
        return new

    def unpin(self, chain: Sequence[int]) -> None:
        """Release one pin on each block; the tail is released first so it is evicted first."""
        pins, lru = self._pins, self._lru
        for block in reversed(chain):
            count = pins[block]
            if count > 1:
                pins[block] = count - 1
            else:
                del pins[block]
                lru[block] = None
        excess = self.resident + self.reserved - self.capacity
        while excess > 0 and lru:  # a forced run over capacity is paid back here
            old, _ = lru.popitem(last=False)
            self.evictions += 1
            self._demote(old)
            excess -= 1
