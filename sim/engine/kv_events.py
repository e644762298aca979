"""vLLM KV cache events: the event types and a ZMQ PUB publisher (PROTOCOLS §1).

Each batch goes out as three frames: topic (utf-8), sequence number (8-byte big-endian, from
0, +1 a batch) and a msgpack `EventBatch` `[ts, [events...]]`. Events use either vLLM's
current tagged-map encoding (`{"type": "BlockStored", ...}`, the default) or the older array
encoding (`["BlockStored", block_hashes, parent, token_ids, block_size, lora_id, medium,
lora_name]`). Block hashes are published as ints, the low 64 bits of the digest, as vLLM
does by default.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import msgpack
import zmq
import zmq.asyncio

from sim.engine.block_hash import event_int


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: list[bytes]
    parent_block_hash: bytes | None
    token_ids: list[int]
    block_size: int
    medium: str = "GPU"


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: list[bytes]
    medium: str = "GPU"


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared
ENCODINGS = ("map", "array")


def encode_event(event: KVEvent, encoding: str = "map") -> Any:
    """One event as msgpack-ready data in vLLM's wire layout."""
    if isinstance(event, BlockStored):
        parent = None if event.parent_block_hash is None else event_int(event.parent_block_hash)
        hashes = [event_int(h) for h in event.block_hashes]
        if encoding == "array":
            return [
                "BlockStored",
                hashes,
                parent,
                event.token_ids,
                event.block_size,
                None,
                event.medium,
                None,
            ]
        return {
            "type": "BlockStored",
            "block_hashes": hashes,
            "parent_block_hash": parent,
            "token_ids": event.token_ids,
            "block_size": event.block_size,
            "lora_id": None,
            "medium": event.medium,
            "lora_name": None,
        }
    if isinstance(event, BlockRemoved):
        hashes = [event_int(h) for h in event.block_hashes]
        if encoding == "array":
            return ["BlockRemoved", hashes, event.medium]
        return {"type": "BlockRemoved", "block_hashes": hashes, "medium": event.medium}
    if encoding == "array":
        return ["AllBlocksCleared"]
    return {"type": "AllBlocksCleared"}


def encode_batch(events: list[KVEvent], ts: float, encoding: str = "map") -> bytes:
    payload: bytes = msgpack.packb([ts, [encode_event(e, encoding) for e in events]])
    return payload


class KVEventPublisher:
    """Publishes event batches on a ZMQ PUB socket bound to `endpoint`."""

    def __init__(self, endpoint: str, topic: str = "kv-events", encoding: str = "map"):
        if encoding not in ENCODINGS:
            raise ValueError(f"unknown KV event encoding {encoding!r}")
        self.endpoint = endpoint
        self.topic = topic.encode()
        self.encoding = encoding
        self.seq = 0
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.PUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SNDHWM, 100_000)
        self._sock.bind(endpoint)

    async def publish(self, events: list[KVEvent]) -> None:
        if not events:
            return
        payload = encode_batch(events, time.time(), self.encoding)
        seq = self.seq.to_bytes(8, "big")
        self.seq += 1
        await self._sock.send_multipart([self.topic, seq, payload])

    def close(self) -> None:
        self._sock.close(linger=0)
        self._ctx.term()
