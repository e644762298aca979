"""vLLM KV events: typed events and their msgpack wire encodings.

Wire format (vLLM `vllm/distributed/kv_events.py`; PROTOCOLS §1): a ZMQ message of three
frames `topic | seq (8-byte big-endian) | payload`, the payload a msgpack array
`[ts, events, data_parallel_rank?]`. Each event is encoded either as an array with its tag
first and its fields in declaration order (older vLLM; fields were only ever appended, so
extra trailing fields are ignored) or as a map with `"type"` naming the class and fields at
their default omitted (vLLM PR #42892). Both decode to the same dataclasses; unknown event
types are counted and skipped so a newer publisher never breaks us.

Block hashes are published as ints (the low 64 bits of the big-endian digest) or as raw
digest bytes; both are normalised to that same 64-bit int.

Sequencing a publisher's batches and applying its events to the index live in
`router.event_feed`. Nothing here does I/O: every publisher (tierd, the simulated engine) and
every consumer (the gateway's ZMQ subscriber, the Redis stream reader) goes through these
functions. Mediums are named in `contracts.tiers.Medium`.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgpack

from contracts.errors import InputError
from contracts.slices import normalize

_INT_ONLY = frozenset({int})

EventEncoding = Literal["array", "map"]


class MalformedEventError(InputError, ValueError):
    """A frame, batch or event that does not follow the wire format."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: tuple[int, ...]
    parent_block_hash: int | None = None
    token_ids: tuple[int, ...] = ()
    block_size: int = 0
    lora_id: int | None = None
    medium: str | None = None  # a `contracts.tiers.Medium`
    lora_name: str | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[int, ...]
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    ts: float
    events: tuple[KvEvent, ...]
    data_parallel_rank: int | None = None
    skipped: int = 0  # events of types we do not know (counted, not an error)


@dataclass(frozen=True, slots=True)
class Frames:
    topic: str
    seq: int
    payload: bytes


# ---- hashes -----------------------------------------------------------------------------


def normalize_hash(value: Any) -> int:
    """An event's block hash as the 64-bit int vLLM publishes by default (the slice-key rule,
    `contracts.slices.normalize`, once the value is known to be a hash)."""
    if isinstance(value, bool):
        raise MalformedEventError(f"block hash must be int or bytes, got {value!r}")
    if isinstance(value, int):
        return normalize(value)
    if isinstance(value, bytes | bytearray):
        if not value:
            raise MalformedEventError("empty block hash")
        return normalize(bytes(value))
    raise MalformedEventError(f"block hash must be int or bytes, got {type(value).__name__}")


def _hashes(value: Any, name: str) -> tuple[int, ...]:
    if not isinstance(value, list | tuple):
        raise MalformedEventError(f"{name} must be a list")
    return tuple(normalize_hash(v) for v in value)


def _opt_int(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise MalformedEventError(f"{name} must be an int or null")
    return value


def _opt_str(value: Any, name: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if not isinstance(value, str):
        raise MalformedEventError(f"{name} must be a string or null")
    return value


def _tokens(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    # `set(map(type, ...))` checks every element in C: token lists are long and this is hot.
    if not isinstance(value, list | tuple) or not set(map(type, value)) <= _INT_ONLY:
        raise MalformedEventError("token_ids must be a list of ints")
    return tuple(value)


# ---- decoding ---------------------------------------------------------------------------

_STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
)
_REMOVED_FIELDS = ("block_hashes", "medium")


def _stored(f: Mapping[str, Any]) -> BlockStored:
    if "block_hashes" not in f:
        raise MalformedEventError("BlockStored without block_hashes")
    parent = f.get("parent_block_hash")
    return BlockStored(
        block_hashes=_hashes(f["block_hashes"], "block_hashes"),
        parent_block_hash=None if parent is None else normalize_hash(parent),
        token_ids=_tokens(f.get("token_ids")),
        block_size=_opt_int(f.get("block_size"), "block_size") or 0,
        lora_id=_opt_int(f.get("lora_id"), "lora_id"),
        medium=_opt_str(f.get("medium"), "medium"),
        lora_name=_opt_str(f.get("lora_name"), "lora_name"),
    )


def _removed(f: Mapping[str, Any]) -> BlockRemoved:
    if "block_hashes" not in f:
        raise MalformedEventError("BlockRemoved without block_hashes")
    return BlockRemoved(
        block_hashes=_hashes(f["block_hashes"], "block_hashes"),
        medium=_opt_str(f.get("medium"), "medium"),
    )


def _tag(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if not isinstance(value, str):
        raise MalformedEventError("event tag must be a string")
    return value


def decode_event(raw: Any) -> KvEvent | None:
    """One event from either encoding; None for an event type we do not know."""
    if isinstance(raw, list | tuple):
        if not raw:
            raise MalformedEventError("empty event array")
        tag = _tag(raw[0])
        values = list(raw[1:])
        if tag == "BlockStored":
            return _stored(dict(zip(_STORED_FIELDS, values, strict=False)))
        if tag == "BlockRemoved":
            return _removed(dict(zip(_REMOVED_FIELDS, values, strict=False)))
    elif isinstance(raw, Mapping):
        fields = {(_tag(k)): v for k, v in raw.items()}
        if "type" not in fields:
            raise MalformedEventError("event map without 'type'")
        tag = _tag(fields["type"])
        if tag == "BlockStored":
            return _stored(fields)
        if tag == "BlockRemoved":
            return _removed(fields)
    else:
        raise MalformedEventError(f"event must be an array or a map, got {type(raw).__name__}")
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    return None


def decode_batch(payload: bytes) -> EventBatch:
    """The msgpack `EventBatch` payload. Raises `MalformedEventError` on anything invalid."""
    try:
        obj = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated exception types
        raise MalformedEventError(f"payload is not msgpack: {exc}") from exc
    if not isinstance(obj, list) or len(obj) < 2:
        raise MalformedEventError("EventBatch must be an array [ts, events, dp_rank?]")
    ts, raw_events = obj[0], obj[1]
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        raise MalformedEventError("EventBatch ts must be a number")
    if not isinstance(raw_events, list):
        raise MalformedEventError("EventBatch events must be an array")
    rank = _opt_int(obj[2], "data_parallel_rank") if len(obj) > 2 else None
    events: list[KvEvent] = []
    skipped = 0
    for raw in raw_events:
        event = decode_event(raw)
        if event is None:
            skipped += 1
        else:
            events.append(event)
    return EventBatch(float(ts), tuple(events), rank, skipped)


def decode_frames(frames: Sequence[bytes]) -> Frames:
    """`[topic, seq, payload]` as received from a SUB socket (seq: 8 bytes, big-endian)."""
    if len(frames) != 3:
        raise MalformedEventError(f"expected 3 frames, got {len(frames)}")
    topic, seq_raw, payload = frames
    if len(seq_raw) != 8:
        raise MalformedEventError(f"sequence frame must be 8 bytes, got {len(seq_raw)}")
    (seq,) = struct.unpack(">q", bytes(seq_raw))
    return Frames(bytes(topic).decode("utf-8", "replace"), seq, bytes(payload))


# ---- encoding ---------------------------------------------------------------------------


def _stored_values(e: BlockStored) -> list[Any]:
    return [
        list(e.block_hashes),
        e.parent_block_hash,
        list(e.token_ids),
        e.block_size,
        e.lora_id,
        e.medium,
        e.lora_name,
    ]


def encode_event(event: KvEvent, encoding: EventEncoding = "array") -> Any:
    """The msgpack-ready form of one event in the chosen encoding."""
    keys: tuple[str, ...]
    if isinstance(event, BlockStored):
        name, keys, values = "BlockStored", _STORED_FIELDS, _stored_values(event)
    elif isinstance(event, BlockRemoved):
        name, keys, values = (
            "BlockRemoved",
            _REMOVED_FIELDS,
            [list(event.block_hashes), event.medium],
        )
    else:
        name, keys, values = "AllBlocksCleared", (), []
    if encoding == "array":
        return [name, *values]
    # The fields we model have no default in vLLM's structs, so msgspec always writes them
    # (the optional later fields, which it omits at their default, we do not produce).
    out: dict[str, Any] = {"type": name}
    out.update(zip(keys, values, strict=True))
    return out


def encode_batch(batch: EventBatch, encoding: EventEncoding = "array") -> bytes:
    """The msgpack `EventBatch` payload; `data_parallel_rank` omitted when None."""
    body: list[Any] = [batch.ts, [encode_event(e, encoding) for e in batch.events]]
    if batch.data_parallel_rank is not None:
        body.append(batch.data_parallel_rank)
    packed: bytes = msgpack.packb(body, use_bin_type=True)
    return packed


def encode_frames(topic: str, seq: int, payload: bytes) -> list[bytes]:
    return [topic.encode(), struct.pack(">q", seq), payload]
