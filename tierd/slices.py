"""The slice format: one block's KV bytes behind a fixed 48-byte header.

Layout (little-endian): magic ``WGSL`` | version u16 | flags u16 | block hash u64 |
parent hash u64 | payload length u64 | token count u32 | payload crc32c u32 |
header crc32c u32 (over the 40 bytes before it) | 4 reserved bytes. Flag bit 0 says the
parent is known, bit 1 that the token count is. The same record is used for array files
and inside snapshot objects. A header or payload whose checksum does not match raises
`CorruptSliceError`: such bytes are never served.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from contracts.errors import InputError
from contracts.slices import HASH_MASK
from tierd.native import crc32c

MAGIC = b"WGSL"
VERSION = 1
_BODY = struct.Struct("<4sHHQQQII")
_TAIL = struct.Struct("<II")
HEADER_BYTES = _BODY.size + _TAIL.size  # 48
_HAS_PARENT = 1
_HAS_TOKENS = 2
U64 = HASH_MASK  # the largest slice hash (`contracts.slices`)

Payload = bytes | memoryview  # a slice's bytes; a view avoids copying out of a read buffer


class SliceFieldError(InputError, ValueError):
    """A slice's hash, parent hash or token count out of its field's range."""


class CorruptSliceError(InputError, ValueError):
    """A slice's header or payload fails its checksum, or the record is torn."""


@dataclass(frozen=True, slots=True)
class SliceMeta:
    """What is known about one slice besides its bytes."""

    hash: int
    length: int
    crc: int
    parent: int | None = None
    tokens: int | None = None


def checksum(payload: bytes | bytearray | memoryview) -> int:
    return int(crc32c(payload))


def make_meta(
    block_hash: int, payload: bytes | memoryview, parent: int | None, tokens: int | None
) -> SliceMeta:
    if not 0 <= block_hash <= U64:
        raise SliceFieldError(f"block hash {block_hash} is not an unsigned 64-bit integer")
    if parent is not None and not 0 <= parent <= U64:
        raise SliceFieldError(f"parent hash {parent} is not an unsigned 64-bit integer")
    if tokens is not None and not 0 <= tokens < (1 << 32):
        raise SliceFieldError(f"token count {tokens} out of range")
    return SliceMeta(block_hash, len(payload), checksum(payload), parent, tokens)


def encode_header(meta: SliceMeta) -> bytes:
    flags = (_HAS_PARENT if meta.parent is not None else 0) | (
        _HAS_TOKENS if meta.tokens is not None else 0
    )
    body = _BODY.pack(
        MAGIC,
        VERSION,
        flags,
        meta.hash,
        meta.parent or 0,
        meta.length,
        meta.tokens or 0,
        meta.crc,
    )
    return body + _TAIL.pack(checksum(body), 0)


def decode_header(buf: bytes | memoryview) -> SliceMeta:
    if len(buf) < HEADER_BYTES:
        raise CorruptSliceError(f"torn header: {len(buf)} of {HEADER_BYTES} bytes")
    body = bytes(buf[: _BODY.size])
    header_crc, _ = _TAIL.unpack_from(buf, _BODY.size)
    magic, version, flags, block_hash, parent, length, tokens, crc = _BODY.unpack(body)
    if magic != MAGIC:
        raise CorruptSliceError(f"bad magic {magic!r}")
    if checksum(body) != header_crc:
        raise CorruptSliceError("header checksum mismatch")
    if version != VERSION:
        raise CorruptSliceError(f"unknown slice format version {version}")
    return SliceMeta(
        hash=block_hash,
        length=length,
        crc=crc,
        parent=parent if flags & _HAS_PARENT else None,
        tokens=tokens if flags & _HAS_TOKENS else None,
    )


def encode_record(meta: SliceMeta, payload: bytes | memoryview) -> bytes:
    return encode_header(meta) + bytes(payload)


def verify_payload(meta: SliceMeta, payload: bytes | memoryview, expect_hash: int) -> None:
    """Raise `CorruptSliceError` unless `payload` is exactly the slice `meta` describes."""
    if meta.hash != expect_hash:
        raise CorruptSliceError(f"record holds {meta.hash:016x}, expected {expect_hash:016x}")
    if len(payload) != meta.length:
        raise CorruptSliceError(f"torn payload: {len(payload)} of {meta.length} bytes")
    if checksum(payload) != meta.crc:
        raise CorruptSliceError("payload checksum mismatch")


def decode_record(buf: bytes | memoryview, expect_hash: int) -> tuple[SliceMeta, memoryview]:
    """Parse and verify one whole record (header + payload, nothing after it); the payload
    is a view into `buf` (no copy)."""
    meta = decode_header(buf)
    payload = memoryview(buf)[HEADER_BYTES:]
    verify_payload(meta, payload, expect_hash)
    return meta, payload
