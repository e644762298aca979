"""tierd's slice format, LRU-K order and session protection: pure data structures."""

from __future__ import annotations

import os

import pytest

from tierd.eviction import AccessHistory, LruK
from tierd.sessions import SessionTracker
from tierd.slices import (
    HEADER_BYTES,
    CorruptSliceError,
    decode_header,
    decode_record,
    encode_record,
    make_meta,
)


def test_record_round_trip_keeps_parent_and_tokens() -> None:
    payload = os.urandom(1000)
    meta = make_meta(2**64 - 1, payload, parent=7, tokens=64)
    meta2, data = decode_record(encode_record(meta, payload), 2**64 - 1)
    assert data == payload
    assert (meta2.parent, meta2.tokens, meta2.length) == (7, 64, 1000)
    bare = decode_header(encode_record(make_meta(5, b"", None, None), b""))
    assert (bare.parent, bare.tokens, bare.length) == (None, None, 0)


@pytest.mark.parametrize("where", ["payload", "header", "truncated", "hash"])
def test_damaged_records_are_refused(where: str) -> None:
    payload = os.urandom(300)
    rec = bytearray(encode_record(make_meta(42, payload, 1, 16), payload))
    expect = 42
    if where == "payload":
        rec[HEADER_BYTES + 17] ^= 0x01
    elif where == "header":
        rec[30] ^= 0x80
    elif where == "truncated":
        del rec[-5:]
    else:
        expect = 43
    with pytest.raises(CorruptSliceError):
        decode_record(bytes(rec), expect)


def test_hash_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError):
        make_meta(2**64, b"x", None, None)


def test_lru_k_evicts_single_touch_first_then_oldest_second_to_last_access() -> None:
    hist = AccessHistory(k=2)
    order = LruK(hist)
    # a: touched twice early; b: once (infinite K-distance); c: twice late; d: once, later
    for h in ("a", "b", "a", "c", "d", "c"):
        key = ord(h)
        hist.touch(key)
        order.update(key)
    ranked = order.victims(4)
    assert [chr(h) for h in ranked] == ["b", "d", "a", "c"]
    # one more touch of `a` is not enough (its 2nd-most-recent access, tick 3, is older
    # than c's, tick 4); two more are
    hist.touch(ord("a"))
    order.update(ord("a"))
    assert [chr(h) for h in order.victims(4)] == ["b", "d", "a", "c"]
    hist.touch(ord("a"))
    order.update(ord("a"))
    assert [chr(h) for h in order.victims(4)] == ["b", "d", "c", "a"]
    # victims() does not remove; skip() passes over protected keys
    assert order.victims(1, skip=lambda h: h == ord("b")) == [ord("d")]
    order.remove(ord("b"))
    assert order.victims(1) == [ord("d")]
    assert len(order) == 3


def test_history_outlives_eviction_and_is_bounded() -> None:
    hist = AccessHistory(k=2, max_entries=2)
    hist.touch(1)
    hist.touch(1)
    assert hist.count(1) == 2
    hist.touch(2)
    hist.touch(3)  # 1 is the least recently touched: forgotten
    assert hist.count(1) == 0
    assert hist.count(3) == 1


def test_lru_k_heap_compacts_under_many_touches() -> None:
    hist = AccessHistory(k=2)
    order = LruK(hist)
    for i in range(10_000):
        key = i % 10
        hist.touch(key)
        order.update(key)
    assert len(order._heap) <= 4 * 10 + 64 + 1
    assert sorted(order.victims(10)) == list(range(10))


def test_sessions_protect_the_last_two_turns_only() -> None:
    now = [0.0]
    tr = SessionTracker(ttl_s=100, max_sessions=10, clock=lambda: now[0])
    tr.new_turn("p")
    tr.add("p", [1, 2])
    tr.new_turn("p")
    tr.add("p", [2, 3])
    assert all(tr.is_protected(h) for h in (1, 2, 3))
    tr.new_turn("p")  # turn with 1 and 2 drops out; 2 is still in the previous turn
    tr.add("p", [4])
    assert not tr.is_protected(1)
    assert tr.is_protected(2) and tr.is_protected(3) and tr.is_protected(4)
    tr.new_turn("q")
    tr.add("q", [3])
    tr.new_turn("p")  # p keeps {4} and the new empty turn; 3 still protected by q
    assert not tr.is_protected(2)
    assert tr.is_protected(3)
    now[0] = 1000.0
    tr.expire()
    assert tr.protected_count == 0 and len(tr) == 0


def test_sessions_shed_oldest_first() -> None:
    tr = SessionTracker(ttl_s=100, max_sessions=2, clock=lambda: 0.0)
    tr.add("a", [1])
    tr.add("b", [2])
    tr.add("c", [3])  # over max_sessions: a goes
    assert not tr.is_protected(1)
    assert tr.shed_oldest()
    assert not tr.is_protected(2) and tr.is_protected(3)


def test_rate_meter_counts_overlapping_transfers_once() -> None:
    from tierd.counters import ThroughputMeter

    m = ThroughputMeter()
    assert m.rate() is None
    m.record(100, 0.0, 1.0)  # serial: 100 B/s
    assert m.rate() == 100.0
    m.record(100, 0.5, 1.5)  # overlaps the first by half: adds 0.5 s busy
    m.record(100, 1.0, 1.5)  # fully covered: adds nothing
    assert m.rate() == 300 / 1.5
    m.record(300, 10.0, 11.0)  # an idle gap before it does not count
    assert m.rate() == 600 / 2.5
