"""Property test of the KV-event decoder, which reads bytes from other processes:
arbitrary bytes, arbitrary msgpack values and arbitrary frame lists are either decoded or
refused with `MalformedEventError`, never anything else (the consumer must never crash)."""

from __future__ import annotations

import contextlib
from typing import Any

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.kv_events import MalformedEventError, decode_batch, decode_frames

msgpack_value = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text()
    | st.binary(),
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.dictionaries(st.text(max_size=5) | st.integers(-(2**63), 2**63 - 1), inner, max_size=5)
    ),
    max_leaves=30,
)


def decodes_or_refuses(payload: bytes) -> None:
    with contextlib.suppress(MalformedEventError):
        decode_batch(payload)


@settings(max_examples=200)
@given(st.binary(max_size=512))
def test_kv_decoder_never_crashes_on_bytes(payload: bytes) -> None:
    decodes_or_refuses(payload)


@settings(max_examples=200)
@given(msgpack_value)
def test_kv_decoder_never_crashes_on_msgpack_values(value: Any) -> None:
    decodes_or_refuses(msgpack.packb(value))
    # shaped like a batch, with arbitrary events inside
    decodes_or_refuses(msgpack.packb([1.0, [value, ["BlockStored", value, value]]]))


@settings(max_examples=300)
@given(st.lists(st.binary(max_size=16), max_size=5))
def test_kv_frames_never_crash(frames: list[bytes]) -> None:
    with contextlib.suppress(MalformedEventError):
        decode_frames(frames)
