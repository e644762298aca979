"""The engine's KV cache events, and their publication in vLLM's wire format (PROTOCOLS §1).

The prefix cache records events with full block digests; `to_wire` turns them into the
shared `contracts.kv_events` types, whose block hashes are ints (the low 64 bits of the digest,
as vLLM publishes them by default), and `EnginePublisher` sends each scheduler step's
events as one batch through `sim.kv_publisher` (ZMQ PUB: frames topic | 8-byte big-endian
seq | msgpack EventBatch, in the `map` or `array` encoding): the same codec the gateway's
consumer decodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

from contracts import kv_events as wire
from contracts.errors import ConfigurationError
from contracts.kv_events import EventEncoding
from router.precise import event_int
from sim.kv_publisher import KvEventPublisher


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
ENCODINGS: tuple[str, ...] = get_args(EventEncoding)


def to_wire(event: KVEvent) -> wire.KvEvent:
    """An engine event as published: hashes as vLLM's 64-bit ints."""
    if isinstance(event, BlockStored):
        parent = event.parent_block_hash
        return wire.BlockStored(
            block_hashes=tuple(event_int(h) for h in event.block_hashes),
            parent_block_hash=None if parent is None else event_int(parent),
            token_ids=tuple(event.token_ids),
            block_size=event.block_size,
            lora_id=None,
            medium=event.medium,
            lora_name=None,
        )
    if isinstance(event, BlockRemoved):
        return wire.BlockRemoved(
            block_hashes=tuple(event_int(h) for h in event.block_hashes), medium=event.medium
        )
    return wire.AllBlocksCleared()


class UnknownEncodingError(ConfigurationError, ValueError):
    """`--kv-events-encoding` names no encoding of the KV event codec."""


class EnginePublisher:
    """Publishes the engine's events on a ZMQ PUB socket bound to `endpoint`."""

    def __init__(self, endpoint: str, topic: str = "kv-events", encoding: str = "map"):
        if encoding == "map":
            self._pub = KvEventPublisher(endpoint, topic=topic, encoding="map")
        elif encoding == "array":
            self._pub = KvEventPublisher(endpoint, topic=topic, encoding="array")
        else:
            raise UnknownEncodingError(f"unknown KV event encoding {encoding!r}")

    @property
    def seq(self) -> int:
        """The sequence number the next batch will carry."""
        return self._pub.seq

    async def publish(self, events: list[KVEvent]) -> None:
        if events:
            await self._pub.publish([to_wire(e) for e in events])

    def close(self) -> None:
        self._pub.close()
