"""Pure-Python fallback of tierd's native copy module: the same API as the C extension
(`_native.pyi`), used where it could not be built, so tierd keeps working (slowly).

Copies are memoryview slice assignments on the calling thread; file batches use os.preadv /
os.pwritev (which release the GIL) on a thread pool, with O_DIRECT through page-aligned mmap
bounce buffers; CRC-32C is the table-driven software algorithm (one table lookup per byte).
There is no GPU backend here: `DeviceArena` and `BlockCopier("cuda")` always raise
(BackendUnavailableError). Errors are the C extension's classes (`tierd.native.errors`).
"""

from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Sequence
from typing import Any

from tierd.native import _checks
from tierd.native._kvcopy import BlockCopier
from tierd.native._pyio import drop_page_cache, probe_direct, read_batch, write_batch
from tierd.native.errors import BackendUnavailableError, NativeArgumentError

__all__ = [
    "IMPLEMENTATION",
    "BlockCopier",
    "DeviceArena",
    "HostArena",
    "backends",
    "copy_batch",
    "crc32c",
    "crc32c_batch",
    "drop_page_cache",
    "memcpy_single",
    "probe_direct",
    "read_batch",
    "write_batch",
]

IMPLEMENTATION = "python"
_CRC32C_POLY = 0x82F63B78  # reflected Castagnoli polynomial


def _make_table() -> tuple[int, ...]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ _CRC32C_POLY if c & 1 else c >> 1
        table.append(c)
    return tuple(table)


_TABLE = _make_table()  # immutable constant


def backends() -> dict[str, dict[str, Any]]:
    no_c = "the C extension is not loaded (pure-Python fallback)"
    return {
        "host": {"built": False, "usable": False, "selected": False, "reason": no_c},
        "hip": {"built": False, "usable": False, "selected": False, "reason": no_c, "devices": 0},
        "cuda": {"built": False, "usable": False, "selected": False, "reason": no_c, "devices": 0},
        "python": {
            "built": True,
            "usable": True,
            "selected": True,
            "reason": "",
            "o_direct": hasattr(os, "O_DIRECT"),
            "crc32c_hw": False,
            "threads": min(16, os.cpu_count() or 1),
        },
    }


class HostArena(mmap.mmap):
    """Page-aligned, zero-filled anonymous memory; `memoryview(arena)` is writable."""

    nbytes: int
    pinned: bool
    backend: str

    def __new__(cls, nbytes: int, *, pinned: bool = False) -> HostArena:
        if nbytes <= 0:
            raise NativeArgumentError(f"nbytes must be positive, not {nbytes}")
        self = super().__new__(cls, -1, nbytes)
        self.nbytes = nbytes
        self.backend = "host"
        self.pinned = False
        if pinned:
            self.pinned = _mlock(self, nbytes)
        return self

    def __init__(self, nbytes: int, *, pinned: bool = False) -> None:
        pass

    def read(self, offset: int, size: int) -> bytes:  # type: ignore[override]
        _checks.check_ranges("arena", self.nbytes, [offset], [size])
        return bytes(self[offset : offset + size])

    def write(self, offset: int, data: Any) -> None:  # type: ignore[override]
        view = _checks.as_bytes_view(data, "data", writable=False)
        _checks.check_ranges("arena", self.nbytes, [offset], [view.nbytes])
        self[offset : offset + view.nbytes] = view

    def __enter__(self) -> HostArena:
        return self


def _mlock(arena: HostArena, nbytes: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        holder = (ctypes.c_char * nbytes).from_buffer(arena)
        addr = ctypes.c_void_p(ctypes.addressof(holder))
        ok: bool = libc.mlock(addr, ctypes.c_size_t(nbytes)) == 0
        del holder
        return ok
    except (OSError, AttributeError):
        return False


class DeviceArena:
    """No GPU backend exists in the pure-Python fallback."""

    nbytes: int
    backend: str
    device: int
    batch_api: bool

    def __init__(self, nbytes: int, backend: str = "cuda", *, device: int = 0) -> None:
        raise BackendUnavailableError(
            f"{backend} backend not usable: the C extension is not loaded"
        )

    def __len__(self) -> int:
        return self.nbytes

    def read(self, offset: int, size: int) -> bytes:
        raise BackendUnavailableError("no device")

    def write(self, offset: int, data: Any) -> None:
        raise BackendUnavailableError("no device")

    def close(self) -> None:
        pass

    def __enter__(self) -> DeviceArena:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def copy_batch(
    dst: Any,
    dst_offsets: Sequence[int],
    src: Any,
    src_offsets: Sequence[int],
    sizes: Sequence[int],
    *,
    threads: int = 0,
) -> int:
    if isinstance(dst, DeviceArena) or isinstance(src, DeviceArena):
        raise BackendUnavailableError("no device")
    if threads < 0:
        raise NativeArgumentError("threads must be >= 0")
    dview = _checks.as_bytes_view(dst, "dst", writable=True)
    sview = _checks.as_bytes_view(src, "src", writable=False)
    doffs = _checks.int_list(dst_offsets, "dst_offsets")
    soffs = _checks.int_list(src_offsets, "src_offsets")
    szs = _checks.int_list(sizes, "sizes")
    _checks.check_lengths(("dst_offsets", doffs), ("src_offsets", soffs), ("sizes", szs))
    _checks.check_ranges("dst", dview.nbytes, doffs, szs)
    _checks.check_ranges("src", sview.nbytes, soffs, szs)
    _checks.check_no_overlap(
        _checks.address_of(dview),
        doffs,
        szs,
        _checks.address_of(sview),
        soffs,
        src_len=sview.nbytes,
        dst_len=dview.nbytes,
    )
    for d, s, n in zip(doffs, soffs, szs, strict=True):
        dview[d : d + n] = sview[s : s + n]
    return sum(szs)


def memcpy_single(dst: Any, dst_offset: int, src: Any, src_offset: int, size: int) -> None:
    copy_batch(dst, [dst_offset], src, [src_offset], [size], threads=1)


def _crc_update(crc: int, data: memoryview) -> int:
    table = _TABLE
    for byte in data.tobytes():
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc


def crc32c(
    buffer: Any, offset: int = 0, size: int = -1, *, value: int = 0, software: bool = False
) -> int:
    view = _checks.as_bytes_view(buffer, "buffer", writable=False)
    if size == -1:
        if offset < 0:
            raise NativeArgumentError(f"negative offset {offset}")
        if offset > view.nbytes:
            raise IndexError(f"offset {offset} is out of range (length {view.nbytes})")
        size = view.nbytes - offset
    _checks.check_ranges("buffer", view.nbytes, [offset], [size])
    if not 0 <= value <= 0xFFFFFFFF:
        raise NativeArgumentError("value must be a 32-bit unsigned CRC")
    crc = _crc_update(value ^ 0xFFFFFFFF, view[offset : offset + size])
    return crc ^ 0xFFFFFFFF


def crc32c_batch(
    buffer: Any, offsets: Sequence[int], sizes: Sequence[int], *, threads: int = 0
) -> list[int]:
    view = _checks.as_bytes_view(buffer, "buffer", writable=False)
    offs = _checks.int_list(offsets, "offsets")
    szs = _checks.int_list(sizes, "sizes")
    _checks.check_lengths(("offsets", offs), ("sizes", szs))
    _checks.check_ranges("buffer", view.nbytes, offs, szs)
    return [crc32c(view, o, s) for o, s in zip(offs, szs, strict=True)]
