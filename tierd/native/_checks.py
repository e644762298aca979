"""Argument checks of the pure-Python fallback, mirroring the C extension's (the same classes,
`tierd.native.errors`).

Slices are checked against their buffer's length (negative -> NativeArgumentError, past the
end -> IndexError). Overlap uses real addresses: the destination intervals are sorted by start and
adjacent ones compared; source intervals are merged into a sorted union and each destination
interval is looked up in it with a binary search, so a batch of n slices costs O(n log n).
"""

from __future__ import annotations

import bisect
import ctypes
import itertools
import operator
from collections.abc import Sequence
from typing import Any

from tierd.native.errors import CopyOverlapError, NativeArgumentError, NativeArgumentTypeError


def as_bytes_view(buffer: Any, name: str, *, writable: bool) -> memoryview:
    """A flat unsigned-byte view of a C-contiguous buffer (NativeArgumentTypeError otherwise)."""
    try:
        view = memoryview(buffer)
    except TypeError:
        raise NativeArgumentTypeError(f"{name} must support the buffer protocol") from None
    if writable and view.readonly:
        raise NativeArgumentTypeError(f"{name} must be writable")
    if not view.c_contiguous:
        raise NativeArgumentTypeError(f"{name} must be C-contiguous")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


class _PyBuffer(ctypes.Structure):
    """CPython's `Py_buffer` (Include/pybuffer.h), to read a buffer's address."""

    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    ]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_PYBUF_SIMPLE = 0


def address_of(view: memoryview) -> int:
    """The address of a byte view's first byte (0 for an empty view), read through the
    buffer protocol (read-only views too, no copy)."""
    if view.nbytes == 0:
        return 0
    buf = _PyBuffer()
    if _get_buffer(view, ctypes.byref(buf), _PYBUF_SIMPLE) != 0:
        raise NativeArgumentTypeError("not a buffer")
    try:
        return int(buf.buf or 0)
    finally:
        _release_buffer(ctypes.byref(buf))


def int_list(values: Sequence[int], name: str) -> list[int]:
    try:
        return [operator.index(v) for v in values]
    except TypeError:
        raise NativeArgumentTypeError(f"{name} must be a sequence of ints") from None


def check_lengths(*named: tuple[str, Sequence[Any]]) -> int:
    lengths = {len(v) for _, v in named}
    if len(lengths) > 1:
        desc = ", ".join(f"{n}={len(v)}" for n, v in named)
        raise NativeArgumentError(f"batch lists differ in length: {desc}")
    return lengths.pop() if lengths else 0


def check_ranges(name: str, length: int, offsets: Sequence[int], sizes: Sequence[int]) -> None:
    for i, (off, size) in enumerate(zip(offsets, sizes, strict=True)):
        if off < 0 or size < 0:
            raise NativeArgumentError(
                f"slice {i}: negative offset or size ({off}, {size}) for {name}"
            )
        if off + size > length:
            raise IndexError(
                f"slice {i}: {name}[{off}:{off + size}] is out of range (length {length})"
            )


def check_file_offsets(offsets: Sequence[int]) -> None:
    for i, off in enumerate(offsets):
        if off < 0:
            raise NativeArgumentError(f"slice {i}: negative file offset {off}")


def _intervals(base: int, offsets: Sequence[int], sizes: Sequence[int]) -> list[tuple[int, int]]:
    return sorted((base + o, base + o + s) for o, s in zip(offsets, sizes, strict=True) if s > 0)


def check_no_overlap(
    dst_base: int,
    dst_offsets: Sequence[int],
    sizes: Sequence[int],
    src_base: int | None = None,
    src_offsets: Sequence[int] | None = None,
    src_len: int = 0,
    dst_len: int = 0,
) -> None:
    """CopyOverlapError if two destination ranges overlap, or a destination overlaps a source."""
    dst = _intervals(dst_base, dst_offsets, sizes)
    for (_s0, e0), (s1, _e1) in itertools.pairwise(dst):
        if s1 < e0:
            raise CopyOverlapError(f"destination ranges overlap at offset {s1 - dst_base}")
    if src_base is None or src_offsets is None:
        return
    if src_base >= dst_base + dst_len or dst_base >= src_base + src_len:
        return  # different memory altogether
    union: list[list[int]] = []
    for s, e in _intervals(src_base, src_offsets, sizes):
        if union and s <= union[-1][1]:
            union[-1][1] = max(union[-1][1], e)
        else:
            union.append([s, e])
    starts = [u[0] for u in union]
    for s, e in dst:
        i = bisect.bisect_right(starts, s) - 1
        for j in (i, i + 1):
            if 0 <= j < len(union) and union[j][0] < e and s < union[j][1]:
                raise CopyOverlapError("a destination range overlaps a source range")
