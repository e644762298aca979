"""The engine's KV block pool with automatic prefix caching (vLLM's v1 design, in counts).

How it works: the pool has `capacity_tokens // block_tokens` blocks. A running sequence holds
its blocks: prompt blocks found in the cache are pinned (ref count + 1), the rest are
reserved as private blocks up front (prompt and output, so a sequence never needs
preemption). When a private block fills, it is committed under its chained hash: it becomes
a cached block (BlockStored), or, if that hash is already cached, the existing block is
pinned and the private one is released. Blocks stored one after another in one chain are
reported as one BlockStored event (its `token_ids` holding every block's tokens), as vLLM
does. A finished sequence unpins its blocks; those at ref count zero stay cached but
evictable, kept in LRU order (a sequence's blocks are queued last block first, so the tail
of a chain goes before its head, as in vLLM).
Allocation evicts the least recently used unpinned blocks (BlockRemoved) when free blocks
run out. Usage, as vLLM reports it, is the share of blocks that are not free or evictable.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from contracts.errors import ConfigurationError, InputError
from sim.engine.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent


class EngineCacheSizeError(ConfigurationError, ValueError):
    """A simulated engine's KV cache that cannot hold one block of a positive size."""


class NoPrivateBlockError(InputError, ValueError):
    """A block committed for an allocation that has no private block left."""


@dataclass
class _Block:
    ref: int
    parent: bytes | None


@dataclass
class Allocation:
    """The blocks one sequence holds."""

    pinned: list[bytes] = field(default_factory=list)
    private: int = 0


class PrefixCache:
    """LRU block pool keyed by chained block hashes; collects KV events as it changes."""

    def __init__(self, capacity_tokens: int, block_tokens: int, medium: str = "GPU"):
        if block_tokens <= 0 or capacity_tokens < block_tokens:
            raise EngineCacheSizeError("capacity must hold at least one block of a positive size")
        self.block_tokens = block_tokens
        self.num_blocks = capacity_tokens // block_tokens
        self.medium = medium
        self._blocks: dict[bytes, _Block] = {}
        self._lru: OrderedDict[bytes, None] = OrderedDict()  # ref == 0, oldest first
        self._private = 0
        self._events: list[KVEvent] = []

    # -- queries -----------------------------------------------------------------------
    def longest_hit(self, hashes: Sequence[bytes]) -> int:
        """How many leading blocks of the chain are cached."""
        n = 0
        for h in hashes:
            if h not in self._blocks:
                break
            n += 1
        return n

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self._blocks

    @property
    def cached_blocks(self) -> int:
        return len(self._blocks)

    @property
    def used_blocks(self) -> int:
        """Blocks held by running sequences (pinned or private)."""
        return len(self._blocks) - len(self._lru) + self._private

    def usage(self) -> float:
        return self.used_blocks / self.num_blocks

    def free_blocks(self) -> int:
        """Blocks available to a new allocation (free plus evictable)."""
        return self.num_blocks - self.used_blocks

    def can_allocate(self, hits: Sequence[bytes], private: int) -> bool:
        reclaimable = sum(1 for h in hits if self._blocks[h].ref == 0)
        return self.free_blocks() - reclaimable >= private

    # -- changes -----------------------------------------------------------------------
    def allocate(self, hits: Sequence[bytes], private: int) -> Allocation:
        """Pin the cached blocks `hits` and reserve `private` new ones, evicting if needed."""
        if not self.can_allocate(hits, private):
            raise MemoryError("not enough KV blocks")
        alloc = Allocation()
        for h in hits:
            self._pin(h)
            alloc.pinned.append(h)
        self._evict_until(private)
        self._private += private
        alloc.private = private
        return alloc

    def commit(
        self, alloc: Allocation, block_hash: bytes, parent: bytes | None, tokens: Sequence[int]
    ) -> None:
        """A private block of `alloc` is full: name it by its hash."""
        if alloc.private <= 0:
            raise NoPrivateBlockError("allocation has no private block left to commit")
        alloc.private -= 1
        self._private -= 1
        if block_hash in self._blocks:
            self._pin(block_hash)
        else:
            self._blocks[block_hash] = _Block(ref=1, parent=parent)
            self._record_stored(block_hash, parent, tokens)
        alloc.pinned.append(block_hash)

    def _record_stored(
        self, block_hash: bytes, parent: bytes | None, tokens: Sequence[int]
    ) -> None:
        """One BlockStored per run of chained blocks stored together, as vLLM publishes."""
        last = self._events[-1] if self._events else None
        if isinstance(last, BlockStored) and last.block_hashes[-1] == parent and parent is not None:
            last.block_hashes.append(block_hash)
            last.token_ids.extend(tokens)
            return
        self._events.append(
            BlockStored(
                block_hashes=[block_hash],
                parent_block_hash=parent,
                token_ids=list(tokens),
                block_size=self.block_tokens,
                medium=self.medium,
            )
        )

    def release(self, alloc: Allocation) -> None:
        """The sequence is done: unpin its blocks (tail first into the LRU), free the rest."""
        for h in reversed(alloc.pinned):
            block = self._blocks.get(h)
            if block is None:  # cleared by reset() meanwhile
                continue
            block.ref -= 1
            if block.ref == 0:
                self._lru[h] = None
        alloc.pinned.clear()
        self._private -= alloc.private
        alloc.private = 0

    def reset(self) -> bool:
        """Drop every evictable block (vLLM's reset_prefix_cache); False if blocks are in use."""
        if self.used_blocks:
            return False
        self._blocks.clear()
        self._lru.clear()
        self._events.append(AllBlocksCleared())
        return True

    def drain_events(self) -> list[KVEvent]:
        events, self._events = self._events, []
        return events

    # -- internals ---------------------------------------------------------------------
    def _pin(self, h: bytes) -> None:
        block = self._blocks[h]
        if block.ref == 0:
            del self._lru[h]
        block.ref += 1

    def _evict_until(self, wanted: int) -> None:
        removed: list[bytes] = []
        while self.num_blocks - len(self._blocks) - self._private < wanted:
            h, _ = self._lru.popitem(last=False)
            del self._blocks[h]
            removed.append(h)
        if removed:
            self._events.append(BlockRemoved(block_hashes=removed, medium=self.medium))
