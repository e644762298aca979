"""vLLM's KV event replay: what an engine published since it started, asked for on demand.

vLLM's ZMQ publisher keeps its last batches (`buffer_steps`, 10,000 by default) behind a
ROUTER socket (`kv_events_config.replay_endpoint`). A DEALER sends `["", start_seq]` (8-byte
big-endian); the engine answers `["", topic, seq, payload]` for every buffered batch with
seq >= start_seq, then `["", "", -1, ""]`. Replayed in order from 0 those batches rebuild
what the engine holds now (stored, then removed), so a gateway that starts after its engines,
or that has just cleared an instance it lost sight of, knows its cache again.
"""

from __future__ import annotations

import time

import zmq
import zmq.asyncio

from contracts.errors import UpstreamError

END_SEQ = (-1).to_bytes(8, "big", signed=True)


class ReplayUnavailable(UpstreamError):
    """The engine did not answer a replay request in time."""


async def fetch_replay(
    ctx: zmq.asyncio.Context, endpoint: str, start_seq: int = 0, timeout_s: float = 5.0
) -> list[list[bytes]]:
    """Every buffered batch from `start_seq` as `[topic, seq, payload]` frames, in order."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        await sock.send_multipart([b"", start_seq.to_bytes(8, "big")])
        out: list[list[bytes]] = []
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not await sock.poll(int(left * 1000)):
                raise ReplayUnavailable(f"{endpoint}: no end of replay within {timeout_s:g}s")
            frames = await sock.recv_multipart()
            body = frames[1:] if frames and frames[0] == b"" else frames
            if len(body) == 3 and body[1] == END_SEQ:
                return out
            if len(body) == 3:
                out.append(body)
            # anything else is not vLLM's replay: skipped
    finally:
        sock.close(linger=0)
