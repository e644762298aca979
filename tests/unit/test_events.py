"""vLLM KV event decoding (both encodings), malformed input, sequencing, and index updates."""

from __future__ import annotations

import struct

import msgpack
import pytest

from contracts.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    MalformedEventError,
    decode_batch,
    decode_frames,
    encode_batch,
    encode_frames,
    normalize_hash,
)
from contracts.tiers import Tier
from router.event_feed import (
    SeqStatus,
    SeqTracker,
    apply_events,
)
from router.index import ARRAY, PrefixIndex
from router.state.residency import Residency

# PROTOCOLS §1, the tagged-map example, packed exactly as msgspec would.
MAP_EXAMPLE = [
    1.5,
    [
        {
            "type": "BlockStored",
            "block_hashes": [123],
            "parent_block_hash": None,
            "token_ids": [1, 2],
            "block_size": 2,
            "lora_id": None,
            "medium": "GPU",
            "lora_name": None,
        },
        {"type": "BlockRemoved", "block_hashes": [123], "medium": "CPU"},
        {"type": "AllBlocksCleared"},
    ],
    0,
]
# The same events in the older array encoding, without a data-parallel rank.
ARRAY_EXAMPLE = [
    1.5,
    [
        ["BlockStored", [123], None, [1, 2], 2, None, "GPU", None],
        ["BlockRemoved", [123], "CPU"],
        ["AllBlocksCleared"],
    ],
]
EXPECTED_EVENTS = (
    BlockStored((123,), None, (1, 2), 2, None, "GPU", None),
    BlockRemoved((123,), "CPU"),
    AllBlocksCleared(),
)


def pack(obj: object) -> bytes:
    data: bytes = msgpack.packb(obj, use_bin_type=True)
    return data


def test_decodes_the_tagged_map_example() -> None:
    batch = decode_batch(pack(MAP_EXAMPLE))
    assert batch.ts == 1.5
    assert batch.data_parallel_rank == 0
    assert batch.events == EXPECTED_EVENTS
    assert batch.skipped == 0


def test_decodes_the_array_encoding() -> None:
    batch = decode_batch(pack(ARRAY_EXAMPLE))
    assert batch.events == EXPECTED_EVENTS
    assert batch.data_parallel_rank is None


def test_map_encoding_omits_defaulted_fields_and_array_encoding_has_extra_fields() -> None:
    short_map = [2.0, [{"type": "BlockStored", "block_hashes": [7, 8], "medium": "CPU"}]]
    (event,) = decode_batch(pack(short_map)).events
    assert event == BlockStored((7, 8), medium="CPU")
    # Newer vLLM appends fields (extra_keys, group_idx, ...): ignored, not an error.
    long_array = [2.0, [["BlockStored", [9], 8, [1], 1, None, "GPU", None, None, 0, "full"]]]
    (event,) = decode_batch(pack(long_array)).events
    assert event == BlockStored((9,), 8, (1,), 1, None, "GPU", None)
    removed = [2.0, [["BlockRemoved", [9], "GPU", 0]]]
    assert decode_batch(pack(removed)).events == (BlockRemoved((9,), "GPU"),)


def test_bytes_hashes_normalise_to_the_low_64_bits_of_the_digest() -> None:
    digest = bytes.fromhex("d830de3d42c00f25a2949b5d12d98642664a44872c1614c5b0147556276afc9c")
    # PROTOCOLS §2: this digest is published as the int 12687895063098490012.
    assert normalize_hash(digest) == 12687895063098490012
    batch = decode_batch(pack([0.0, [["BlockRemoved", [digest], "GPU"]]]))
    assert batch.events == (BlockRemoved((12687895063098490012,), "GPU"),)
    assert normalize_hash(-1) == (1 << 64) - 1


def test_unknown_event_types_are_counted_and_skipped() -> None:
    payload = pack([1.0, [["FutureEvent", 1], {"type": "Other"}, ["AllBlocksCleared"]]])
    batch = decode_batch(payload)
    assert batch.events == (AllBlocksCleared(),)
    assert batch.skipped == 2


@pytest.mark.parametrize("encoding", ["array", "map"])
def test_encode_then_decode_round_trips(encoding: str) -> None:
    batch = EventBatch(3.25, EXPECTED_EVENTS, data_parallel_rank=2)
    assert decode_batch(encode_batch(batch, encoding)) == batch  # type: ignore[arg-type]


def test_map_encoding_matches_the_protocols_example_byte_for_byte() -> None:
    batch = EventBatch(1.5, EXPECTED_EVENTS, data_parallel_rank=0)
    assert encode_batch(batch, "map") == pack(MAP_EXAMPLE)
    assert encode_batch(EventBatch(1.5, EXPECTED_EVENTS), "array") == pack(ARRAY_EXAMPLE)


@pytest.mark.parametrize(
    "payload",
    [
        b"\xc1",  # never-used msgpack byte
        b"",
        pack({"ts": 1.0}),
        pack([1.0]),
        pack(["x", []]),
        pack([1.0, {"not": "a list"}]),
        pack([1.0, [42]]),
        pack([1.0, [[]]]),
        pack([1.0, [{"block_hashes": [1]}]]),
        pack([1.0, [["BlockStored"]]]),
        pack([1.0, [["BlockStored", "nope"]]]),
        pack([1.0, [["BlockStored", [1.5]]]]),
        pack([1.0, [["BlockStored", [1], None, ["a"]]]]),
        pack([1.0, [["BlockRemoved", [1], 7]]]),
        pack([1.0, [], "rank"]),
        pack([1.0, [["BlockStored", [True]]]]),
    ],
)
def test_malformed_payloads_raise_malformed_event_error(payload: bytes) -> None:
    with pytest.raises(MalformedEventError):
        decode_batch(payload)


def test_frames_round_trip_and_malformed_frames() -> None:
    frames = encode_frames("kv-events", 7, b"payload")
    assert frames[1] == struct.pack(">q", 7)
    decoded = decode_frames(frames)
    assert (decoded.topic, decoded.seq, decoded.payload) == ("kv-events", 7, b"payload")
    with pytest.raises(MalformedEventError):
        decode_frames([b"kv-events", b"\x00\x01", b"x"])
    with pytest.raises(MalformedEventError):
        decode_frames([b"kv-events", b"x"])


def test_seq_tracker_classifies_order_gaps_and_restarts() -> None:
    t = SeqTracker()
    assert t.observe(5).status is SeqStatus.FIRST
    assert t.observe(6).status is SeqStatus.IN_ORDER
    gap = t.observe(9)
    assert (gap.status, gap.missed, gap.must_resync) == (SeqStatus.GAP, 2, True)
    assert t.observe(10).status is SeqStatus.IN_ORDER
    restart = t.observe(0)
    assert restart.status is SeqStatus.RESTART and restart.must_resync
    assert t.observe(1).status is SeqStatus.IN_ORDER
    assert t.observe(1).status is SeqStatus.RESTART  # a repeated number is not trusted either
    assert (t.gaps, t.missed, t.restarts) == (1, 2, 2)


def held(index: PrefixIndex, instance: str, hashes: list[int]) -> dict[Tier, int]:
    return dict(index.match(hashes, [instance])[instance])


def test_apply_events_places_each_medium_in_its_tier() -> None:
    index = PrefixIndex()
    events = [
        BlockStored((1, 2), medium="GPU"),
        BlockStored((3,), medium="CPU"),
        BlockStored((4,), medium="STORAGE"),
        BlockStored((5,), medium="ARRAY"),
        BlockStored((6,), medium="SNAPSHOT"),
        BlockStored((7,), medium="TAPE"),
    ]
    counts = apply_events(index, "i0", events)
    assert counts.stored == 6 and counts.unknown_medium == 1
    assert counts.by_tier == {Tier.HBM: 2, Tier.HOST: 1, Tier.ARRAY: 2, Tier.SNAPSHOT: 1}
    assert held(index, "i0", [1, 2, 3]) == {Tier.HBM: 2, Tier.HOST: 1}
    assert index.blocks_held(ARRAY) == 2
    # The array counts for any instance, even one that never published.
    assert held(index, "other", [4, 5]) == {Tier.ARRAY: 2}
    assert held(index, "i0", [6]) == {Tier.SNAPSHOT: 1}
    apply_events(index, "i0", [BlockRemoved((2,), "GPU"), BlockRemoved((4,), "STORAGE")])
    assert held(index, "i0", [1, 2]) == {Tier.HBM: 1}
    assert index.blocks_held(ARRAY) == 1
    apply_events(index, "i0", [AllBlocksCleared()])
    assert index.blocks_held("i0") == 0
    assert index.blocks_held(ARRAY) == 1  # clearing an engine's cache leaves the array alone


def stored(seq_hashes: tuple[int, ...], medium: str = "GPU") -> EventBatch:
    return EventBatch(0.0, (BlockStored(seq_hashes, medium=medium),))


def test_residency_drops_a_source_on_gap_and_restart_only() -> None:
    index = PrefixIndex()
    res = Residency()
    res.apply("i0", 0, stored((1, 2)), index)
    res.apply("i0", 1, stored((3,), "ARRAY"), index)
    res.apply("i1", 0, stored((9,)), index)
    assert index.blocks_held("i0") == 2 and index.blocks_held(ARRAY) == 1
    verdict, _ = res.apply("i0", 5, stored((4,)), index)  # seq 2..4 lost
    assert verdict.status is SeqStatus.GAP
    # i0's earlier blocks, its array blocks included, are gone; the new batch is kept.
    assert held(index, "i0", [4]) == {Tier.HBM: 1}
    assert index.blocks_held("i0") == 1 and index.blocks_held(ARRAY) == 0
    assert index.blocks_held("i1") == 1  # another source is untouched
    verdict, _ = res.apply("i1", 0, stored((8,)), index)  # i1 restarted
    assert verdict.status is SeqStatus.RESTART
    assert index.blocks_held("i1") == 1 and held(index, "i1", [8]) == {Tier.HBM: 1}


def test_residency_snapshot_restores_index_and_sequence() -> None:
    index = PrefixIndex()
    res = Residency()
    res.apply("i0", 3, stored((1, 2, 3)), index)
    res.apply("i0", 4, EventBatch(0.0, (BlockRemoved((2,), "GPU"),)), index)
    res.apply("i1", 0, stored(((1 << 64) - 1, 5), "ARRAY"), index)
    data = res.encode()
    assert len(data) < 100  # 8 bytes a block plus a little framing

    fresh_index = PrefixIndex()
    fresh = Residency()
    assert fresh.restore(data, fresh_index) == 4
    assert held(fresh_index, "i0", [1]) == {Tier.HBM: 1}
    assert held(fresh_index, "i0", [3]) == {Tier.HBM: 1}
    assert held(fresh_index, "i0", [2]) == {}
    assert fresh_index.blocks_held(ARRAY) == 2
    assert fresh.last_seq("i0") == 4 and fresh.last_seq("i1") == 0
    verdict, _ = fresh.apply("i0", 5, stored((7,)), fresh_index)
    assert verdict.status is SeqStatus.IN_ORDER
    with pytest.raises(MalformedEventError):
        fresh.restore(b"garbage", fresh_index)
    with pytest.raises(MalformedEventError):
        fresh.restore(pack({"v": 1, "sources": [["i0", 0, [["i0", 0, b"123"]]]]}), fresh_index)
