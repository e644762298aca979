"""An engine's KV event replay: what it published since it started, asked for on demand.

vLLM's ZMQ publisher keeps its last batches (`buffer_steps`, 10,000 by default) behind a
ROUTER socket (`kv_events_config.replay_endpoint`); the frames asked and answered are its
engine kind's (`Engine.kv_events.replay`, `gateway.engine.kv_wire.VllmReplay`). Replayed in
order from 0 those batches rebuild what the engine holds now (stored, then removed), so a
gateway that starts after its engines, or that has just cleared an instance it lost sight
of, knows its cache again. This module does the socket work: a DEALER, one request, the
answers until the end or the deadline.
"""

from __future__ import annotations

import time

import zmq
import zmq.asyncio

from contracts.errors import UpstreamError
from gateway.engine.base import KvReplay


class ReplayUnavailable(UpstreamError):
    """The engine did not answer a replay request in time."""


async def fetch_replay(
    ctx: zmq.asyncio.Context,
    endpoint: str,
    replay: KvReplay,
    start_seq: int = 0,
    timeout_s: float = 5.0,
) -> list[list[bytes]]:
    """Every buffered batch from `start_seq` as `[topic, seq, payload]` frames, in order."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        await sock.send_multipart(replay.request(start_seq))
        out: list[list[bytes]] = []
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not await sock.poll(int(left * 1000)):
                raise ReplayUnavailable(f"{endpoint}: no end of replay within {timeout_s:g}s")
            answer = replay.answer(await sock.recv_multipart())
            if answer == "end":
                return out
            if answer is not None:
                out.append(list(answer))
    finally:
        sock.close(linger=0)
