"""The one resync rule (router.event_feed.drop_publisher): the gateway's ZMQ subscriber and
the Redis stream reader drop exactly the same things when one publisher's sequence gaps —
everything of its instance (predictions included) and the blocks it reported in the shared
array, nothing of another instance."""

from __future__ import annotations

from contracts.kv_events import BlockStored, EventBatch, encode_batch, encode_frames
from contracts.tiers import Medium, Tier
from gateway.fleet.kv_events import KvEventConsumer
from router.index import ARRAY, PrefixIndex
from router.state.residency import Residency

CHAIN = [11, 12, 13, 14]


def _batches() -> list[tuple[int, EventBatch]]:
    return [
        (0, EventBatch(1.0, (BlockStored((11, 12), medium=Medium.GPU),))),
        (1, EventBatch(2.0, (BlockStored((11, 12, 13), medium=Medium.STORAGE),))),
        # seq 2 and 3 are lost: a gap
        (4, EventBatch(3.0, (BlockStored((14,), medium=Medium.CPU),))),
    ]


def _seeded() -> PrefixIndex:
    index = PrefixIndex(ttl_s=600.0, clock=lambda: 0.0)
    index.insert("i1", CHAIN, Tier.HBM)  # another instance's own KV
    index.insert("i0", CHAIN, Tier.HBM, predicted=True)  # a prediction on the publisher's
    return index


def _state(index: PrefixIndex) -> dict[str, dict[Tier, int]]:
    return index.match(CHAIN, ["i0", "i1"])


def test_zmq_and_stream_consumers_resync_a_gap_alike() -> None:
    via_zmq, via_stream = _seeded(), _seeded()
    consumer = KvEventConsumer(via_zmq, {"i0": "tcp://127.0.0.1:1"})  # never started
    residency = Residency()
    for seq, batch in _batches()[:2]:
        consumer.handle("i0", encode_frames("", seq, encode_batch(batch)))
        residency.apply("i0", seq, batch, via_stream)
    assert via_zmq.blocks_held(ARRAY) == via_stream.blocks_held(ARRAY) == 3
    seq, batch = _batches()[2]
    consumer.handle("i0", encode_frames("", seq, encode_batch(batch)))
    residency.apply("i0", seq, batch, via_stream)
    assert _state(via_zmq) == _state(via_stream)
    assert via_zmq.blocks_held(ARRAY) == via_stream.blocks_held(ARRAY) == 0  # array reports go
    assert _state(via_zmq)["i1"] == {Tier.HBM: 4}  # another instance is untouched
    # the publisher's instance keeps only what it reported after the gap (block 14 alone is
    # no leading run) and its prediction went with the rest
    assert _state(via_zmq)["i0"] == {} and via_zmq.blocks_held("i0") == 1
