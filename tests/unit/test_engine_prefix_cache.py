"""sim.engine.prefix_cache: hits, pinning, LRU eviction order, usage and KV events."""

from __future__ import annotations

import pytest

from sim.engine.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from sim.engine.prefix_cache import PrefixCache


def h(i: int) -> bytes:
    return i.to_bytes(32, "big")


def fill(cache: PrefixCache, hashes: list[bytes]) -> None:
    """One sequence computes `hashes` as a chain, then finishes."""
    alloc = cache.allocate([], len(hashes))
    parent = None
    for x in hashes:
        cache.commit(alloc, x, parent, [1, 2, 3, 4])
        parent = x
    cache.release(alloc)


def test_commit_stores_and_lookup_finds_leading_blocks() -> None:
    cache = PrefixCache(capacity_tokens=40, block_tokens=4)
    assert cache.num_blocks == 10
    fill(cache, [h(1), h(2), h(3)])
    assert cache.longest_hit([h(1), h(2), h(3), h(4)]) == 3
    assert cache.longest_hit([h(1), h(9), h(3)]) == 1
    assert cache.longest_hit([h(9)]) == 0
    (event,) = cache.drain_events()  # one chain stored together: one event
    assert isinstance(event, BlockStored)
    assert event.block_hashes == [h(1), h(2), h(3)] and event.parent_block_hash is None
    assert event.block_size == 4 and event.token_ids == [1, 2, 3, 4] * 3
    assert event.medium == "GPU"
    assert cache.drain_events() == []
    fill(cache, [h(4)])  # a new chain: a new event
    (other,) = cache.drain_events()
    assert isinstance(other, BlockStored) and other.block_hashes == [h(4)]


def test_usage_counts_held_blocks_only() -> None:
    cache = PrefixCache(capacity_tokens=40, block_tokens=4)
    fill(cache, [h(1), h(2)])
    assert cache.usage() == 0.0 and cache.cached_blocks == 2
    alloc = cache.allocate([h(1), h(2)], 3)
    assert cache.used_blocks == 5 and cache.usage() == pytest.approx(0.5)
    cache.release(alloc)
    assert cache.usage() == 0.0 and cache.free_blocks() == 10


def test_lru_evicts_oldest_unpinned_tail_first() -> None:
    cache = PrefixCache(capacity_tokens=16, block_tokens=4)  # 4 blocks
    fill(cache, [h(1), h(2)])  # chain A
    fill(cache, [h(3), h(4)])  # chain B, more recent
    cache.drain_events()
    alloc = cache.allocate([], 1)
    removed = cache.drain_events()
    # chain A is older; its tail goes before its head
    assert removed == [BlockRemoved(block_hashes=[h(2)])]
    assert cache.longest_hit([h(1)]) == 1 and cache.longest_hit([h(1), h(2)]) == 1
    cache.release(alloc)


def test_pinned_blocks_are_never_evicted_and_overcommit_is_refused() -> None:
    cache = PrefixCache(capacity_tokens=16, block_tokens=4)
    fill(cache, [h(1), h(2)])
    held = cache.allocate([h(1), h(2)], 0)
    assert cache.can_allocate([], 2) and not cache.can_allocate([], 3)
    with pytest.raises(MemoryError):
        cache.allocate([], 3)
    other = cache.allocate([], 2)
    assert cache.longest_hit([h(1), h(2)]) == 2
    cache.release(other)
    cache.release(held)


def test_hit_on_an_evictable_block_counts_against_free_space() -> None:
    cache = PrefixCache(capacity_tokens=16, block_tokens=4)
    fill(cache, [h(1), h(2), h(3), h(4)])
    # all four are evictable; pinning two of them leaves two to reclaim
    assert cache.can_allocate([h(1), h(2)], 2)
    assert not cache.can_allocate([h(1), h(2)], 3)


def test_duplicate_commit_pins_existing_block() -> None:
    cache = PrefixCache(capacity_tokens=16, block_tokens=4)
    a = cache.allocate([], 1)
    b = cache.allocate([], 1)
    cache.commit(a, h(7), None, [1])
    cache.commit(b, h(7), None, [1])
    assert cache.cached_blocks == 1 and cache.used_blocks == 1
    assert len(cache.drain_events()) == 1
    cache.release(a)
    assert cache.used_blocks == 1  # b still holds it
    cache.release(b)
    assert cache.used_blocks == 0 and cache.longest_hit([h(7)]) == 1


def test_reset_clears_when_idle_only() -> None:
    cache = PrefixCache(capacity_tokens=16, block_tokens=4)
    fill(cache, [h(1)])
    alloc = cache.allocate([h(1)], 0)
    assert cache.reset() is False
    cache.release(alloc)
    cache.drain_events()
    assert cache.reset() is True
    assert cache.cached_blocks == 0 and cache.drain_events() == [AllBlocksCleared()]
