"""An async ZMQ PUB publisher of vLLM-format KV event batches (PROTOCOLS §1).

Binds a PUB socket (like vLLM's `--kv-events-config` publisher) and sends each batch as
three frames `topic | seq (8-byte big-endian, from 0, +1 a batch) | msgpack EventBatch`,
in either encoding (`map`, vLLM's current one, or `array`). Sends never block: a PUB socket
drops messages for a subscriber past its high-water mark, which subscribers see as a
sequence gap. The codec is `contracts.kv_events`, so what this publishes is exactly what the
gateway's consumer decodes. `send_raw` exists for tests that need malformed messages.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

import zmq
import zmq.asyncio

from contracts.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    EventEncoding,
    KvEvent,
    encode_batch,
    encode_frames,
)


class KvEventPublisher:
    def __init__(
        self,
        endpoint: str,
        *,
        topic: str = "kv-events",
        encoding: EventEncoding = "map",
        data_parallel_rank: int | None = None,
        first_seq: int = 0,
        sndhwm: int = 100_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.endpoint = endpoint
        self.topic = topic
        self.encoding: EventEncoding = encoding
        self.data_parallel_rank = data_parallel_rank
        self.seq = first_seq  # the sequence number of the next batch
        self._clock = clock
        self._lock = asyncio.Lock()
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.PUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SNDHWM, sndhwm)
        try:
            self._sock.bind(endpoint)
        except zmq.ZMQError:
            self.close()
            raise
        self.bound_endpoint: str = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)

    async def publish(self, events: Sequence[KvEvent]) -> int:
        """Send one batch; return its sequence number."""
        batch = EventBatch(self._clock(), tuple(events), self.data_parallel_rank)
        return await self.send_raw(encode_batch(batch, self.encoding))

    async def send_raw(self, payload: bytes) -> int:
        """Send `payload` as the next batch, whatever it holds; return its sequence number."""
        async with self._lock:
            seq = self.seq
            self.seq += 1
            await self._sock.send_multipart(encode_frames(self.topic, seq, payload))
            return seq

    async def send_frames(self, frames: Sequence[bytes]) -> None:
        """Send arbitrary frames (for tests of malformed messages); no sequence number used."""
        async with self._lock:
            await self._sock.send_multipart(list(frames))

    async def stored(
        self,
        hashes: Sequence[int],
        *,
        medium: str = "GPU",
        parent: int | None = None,
        token_ids: Sequence[int] = (),
        block_size: int = 0,
    ) -> int:
        event = BlockStored(tuple(hashes), parent, tuple(token_ids), block_size, None, medium)
        return await self.publish([event])

    async def removed(self, hashes: Sequence[int], *, medium: str = "GPU") -> int:
        return await self.publish([BlockRemoved(tuple(hashes), medium)])

    async def cleared(self) -> int:
        return await self.publish([AllBlocksCleared()])

    def close(self) -> None:
        self._sock.close(linger=0)
        self._ctx.term()
