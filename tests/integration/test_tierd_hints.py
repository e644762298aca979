"""The prefetch on-time share (`tierd.hints`): a real tierd, its KV socket and the
connector's client; the engine's lookup after a hint is what counts."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from tests.integration.test_tierd_kvsocket import save, settings, started, wait_for
from tierd.hints import HintLedger
from tierd.kvwire import KvClient


def test_the_ledger_counts_the_first_ask_of_hinted_blocks_only() -> None:
    ledger = HintLedger(capacity=3)
    ledger.hinted([1, 2, 3])
    ledger.asked([1, 2, 9], in_host=lambda h: h == 1)  # 9 was never hinted
    ledger.asked([1], in_host=lambda h: True)  # asked again: counted once
    assert ledger.stats()["prefetch_on_time"] == 1 and ledger.stats()["prefetch_late"] == 1
    assert ledger.stats()["prefetch_on_time_share"] == 0.5
    ledger.hinted([4, 5, 6])  # capacity 3: 3 (still pending) is forgotten
    ledger.asked([3], in_host=lambda h: True)
    assert ledger.stats()["prefetch_hinted_forgotten"] == 1
    assert ledger.stats()["prefetch_on_time"] == 1


def test_a_hint_that_comes_after_the_engine_asked_is_late() -> None:
    ledger = HintLedger()
    ledger.asked([1, 2], in_host=lambda h: True)  # nothing hinted yet: remembered
    ledger.hinted([1, 2, 3])
    ledger.asked([3], in_host=lambda h: True)
    stats = ledger.stats()
    assert (stats["prefetch_late"], stats["prefetch_on_time"]) == (2, 1)
    assert stats["prefetch_late_hint_after_ask"] == 2
    assert stats["prefetch_hinted_blocks"] == 3


def test_retries_of_a_waiting_request_are_not_asks_before_the_next_hint() -> None:
    now = [100.0]
    ledger = HintLedger(clock=lambda: now[0])
    ledger.hinted([1, 2])
    ledger.asked([1, 2], in_host=lambda h: True, request="turn-1")
    now[0] += 0.6
    ledger.asked([1, 2], in_host=lambda h: True, request="turn-1")  # vLLM retried it
    now[0] += 0.5
    ledger.hinted([1, 2, 3])  # the next turn's hint: its blocks are not yet asked for
    ledger.asked([1, 2, 3], in_host=lambda h: h != 3, request="turn-2")
    stats = ledger.stats()
    assert stats["prefetch_reasked"] == 2 and stats.get("prefetch_late_hint_after_ask", 0) == 0
    assert (stats["prefetch_on_time"], stats["prefetch_late"]) == (4, 1)


def test_only_an_ask_just_before_the_hint_raced_it() -> None:
    now = [100.0]
    ledger = HintLedger(race_s=2.0, clock=lambda: now[0])
    ledger.asked([1], in_host=lambda h: True, request="unhinted")  # another request's ask
    now[0] += 5.0
    ledger.asked([2], in_host=lambda h: True, request="raced")
    now[0] += 0.01
    ledger.hinted([1, 2])  # 2 raced its ask; 1 awaits an ask of its own
    assert ledger.stats()["prefetch_late_hint_after_ask"] == 1
    ledger.asked([1], in_host=lambda h: True, request="hinted")
    assert ledger.stats()["prefetch_on_time"] == 1


def test_an_eviction_before_the_ask_is_counted_for_blocks_still_awaited() -> None:
    now = [100.0]
    ledger = HintLedger(ttl_s=30.0, clock=lambda: now[0])
    ledger.hinted([1, 2, 3])
    ledger.asked([1], in_host=lambda h: True)  # 1 asked: no longer awaited
    assert [ledger.awaiting(h) for h in (1, 2, 3, 4)] == [False, True, True, False]
    ledger.evicted([1, 2, 4])  # only 2 was still to be asked for
    assert ledger.stats()["prefetch_evicted_before_ask"] == 1
    now[0] += 31.0  # past the TTL: 3's hint no longer answers for an ask
    assert not ledger.awaiting(3)
    ledger.evicted([3])
    assert ledger.stats()["prefetch_evicted_before_ask"] == 1


def test_a_late_block_no_tier_held_at_the_hint_is_counted_as_absent() -> None:
    ledger = HintLedger()
    ledger.hinted([1, 2, 3])
    ledger.absent([2, 3, 9])  # the prefetch found 2 and 3 nowhere (9 was never hinted)
    ledger.asked([1, 2, 3], in_host=lambda h: h == 3)  # 3 arrived in time after all
    stats = ledger.stats()
    assert (stats["prefetch_late"], stats["prefetch_late_absent_at_hint"]) == (2, 1)
    assert stats["prefetch_on_time"] == 1


def test_an_ask_long_after_the_hint_is_not_this_hints() -> None:
    now = [100.0]
    ledger = HintLedger(ttl_s=30.0, clock=lambda: now[0])
    ledger.hinted([1, 2])
    now[0] += 31.0
    ledger.asked([1, 2], in_host=lambda h: True)
    stats = ledger.stats()
    assert stats["prefetch_hint_expired"] == 2 and stats["prefetch_on_time_share"] is None


async def test_a_hinted_chain_in_host_memory_when_the_engine_looks_it_up_is_on_time(
    tmp_path: Path,
) -> None:
    d = await started(settings(tmp_path, "a"))
    try:
        blocks = {5000 + i: os.urandom(4096) for i in range(4)}
        client = await asyncio.to_thread(KvClient, str(tmp_path / "a.sock"), "ns", "worker")
        await asyncio.to_thread(save, client, blocks)
        await wait_for(lambda: all(d.store.l1.entry(h) is not None for h in blocks))
        assert d.kv is not None
        assert d.kv.stats()["prefetch_on_time_share"] is None  # nothing asked yet
        await d.prefetcher.prefetch([*blocks, 7], 1.0)  # 7: in no tier
        found = await asyncio.to_thread(client.call, {"op": "lookup", "hashes": [*blocks, 7]})
        assert found["n"] == 4
        stats = d.kv.stats()
        assert stats["prefetch_hinted_blocks"] == 5
        assert stats["prefetch_on_time"] == 4 and stats.get("prefetch_late", 0) == 0
        assert stats["prefetch_on_time_share"] == 1.0
        assert d.stats()["connector"]["prefetch_on_time_share"] == 1.0
        client.close()
    finally:
        await d.close()
