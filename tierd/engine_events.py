"""The engine's own KV events, heard by the tierd beside it (ZMQ SUB, vLLM's format).

A `BlockRemoved` of the engine's device cache means tierd's copy is now the nearest one:
`KvServer.engine_removed` lets it pass the frequency gate into the array when L1 evicts
it, instead of being dropped as a block seen once. `BlockStored`, `BlockRemoved` and
`AllBlocksCleared` also keep tierd's view of what the engine holds (`tierd.residency`), so
a prefetch passes over the blocks the engine will not ask for. Decoding is the router's
(`contracts.kv_events`): one owner of the event format.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from typing import Any

import zmq
import zmq.asyncio

from contracts.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    MalformedEventError,
    decode_batch,
    decode_frames,
)
from contracts.tiers import Medium
from tierd.kvserver import KvServer

log = logging.getLogger("tierd.engine_events")


class EngineEvents:
    """Subscribes to one engine's KV event endpoint and tells the KV server what left it."""

    def __init__(self, endpoint: str, kv: KvServer, topic: str = "") -> None:
        self.endpoint = endpoint
        self.kv = kv
        self.topic = topic
        self.counters: Counter[str] = Counter()
        self._ctx: zmq.asyncio.Context | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._ctx = zmq.asyncio.Context()
        sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt_string(zmq.SUBSCRIBE, self.topic)
        sock.connect(self.endpoint)
        self._task = asyncio.create_task(self._run(sock), name="tierd-engine-events")

    async def _run(self, sock: Any) -> None:
        try:
            while True:
                self.handle(await sock.recv_multipart())
        finally:
            sock.close(linger=0)

    def handle(self, frames: list[bytes]) -> None:
        try:
            batch = decode_batch(decode_frames(frames).payload)
        except MalformedEventError as exc:
            self.counters["malformed"] += 1
            log.warning("malformed engine event batch: %s", exc)
            return
        self.counters["batches"] += 1
        for event in batch.events:
            if isinstance(event, AllBlocksCleared):
                self.kv.engine_cleared()
                self.counters["cleared"] += 1
                continue
            if (event.medium or Medium.GPU).upper() != Medium.GPU:
                continue
            if isinstance(event, BlockRemoved):
                self.kv.engine_removed(list(event.block_hashes))
                self.counters["removed"] += len(event.block_hashes)
            elif isinstance(event, BlockStored):
                self.kv.engine_stored(list(event.block_hashes))
                self.counters["stored"] += len(event.block_hashes)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._ctx is not None:
            self._ctx.term()

    def stats(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, **self.counters}
