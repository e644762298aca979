"""The KV event wire vLLM defines and every publisher here speaks (PROTOCOLS §1): ZMQ frames
`topic | 8-byte big-endian seq | msgpack EventBatch`, decoded by `contracts.kv_events`; and
vLLM's replay protocol (`kv_events_config.replay_endpoint`, a ROUTER socket): a DEALER sends
`["", start_seq]` (8-byte big-endian), the engine answers `["", topic, seq, payload]` for
every buffered batch with seq >= start_seq, then `["", "", -1, ""]`.

- `VLLM_EVENTS`: vLLM's publisher, with its replay; the KV event consumer's default for a
  source whose wire it is not told (tierd publishes this wire, without a replay endpoint);
- `PUBLISHED_EVENTS`: the same messages from a publisher with no replay (the simulated
  engine).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from contracts.kv_events import EventBatch, Frames, decode_batch, decode_frames
from gateway.engine.base import KvReplay, ReplayAnswer

END_SEQ = (-1).to_bytes(8, "big", signed=True)


@dataclass(frozen=True, slots=True)
class VllmReplay:
    """vLLM's replay request and answers (the module docstring has the frames)."""

    def request(self, start_seq: int) -> list[bytes]:
        return [b"", start_seq.to_bytes(8, "big")]

    def answer(self, frames: Sequence[bytes]) -> ReplayAnswer:
        body = frames[1:] if frames and frames[0] == b"" else frames
        if len(body) != 3:
            return None  # not vLLM's replay: skipped
        if body[1] == END_SEQ:
            return "end"
        return list(body)


@dataclass(frozen=True, slots=True)
class ContractWire:
    """`contracts.kv_events`' messages, with the publisher's replay protocol (None: none)."""

    replay: KvReplay | None = None

    def decode_frames(self, frames: Sequence[bytes]) -> Frames:
        return decode_frames(frames)

    def decode_batch(self, payload: bytes) -> EventBatch:
        return decode_batch(payload)


VLLM_EVENTS = ContractWire(replay=VllmReplay())
PUBLISHED_EVENTS = ContractWire(replay=None)
