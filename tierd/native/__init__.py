"""tierd's native copy module: the byte mover of the tier daemon.

At import this picks the C extension (`tierd.native._native`, built by `pip install`) or,
when it is missing or `WARMGATE_NATIVE=python` is set, the pure-Python fallback
(`tierd.native._fallback`); `backends()` says which and why. The API (types in `_native.pyi`):

- `backends() -> dict[str, dict]`: `host`, `hip`, `cuda`, `python`, each with `built`,
  `usable`, `selected`, `reason` and flags (`o_direct`, `crc32c_hw`, `threads`, `devices`).
- `HostArena(nbytes, *, pinned=False)`: page-aligned host memory, `memoryview(arena)`.
  `DeviceArena(nbytes, backend="cuda"|"hip")`: device memory where a GPU backend is usable.
- `copy_batch(dst, dst_offsets, src, src_offsets, sizes, *, threads=0) -> int`: many slices
  in one call, between any two of host buffers, HostArena, DeviceArena.
- `BlockCopier(backend="host"|"cuda"|"hip", device=0)`: gathers / scatters KV blocks between
  buffers an engine owns (raw pointers: torch's `data_ptr()`) and slices of a host buffer,
  every layer in one call; on a GPU asynchronously (tickets), host memory registered once.
- `read_batch(paths, dst, dst_offsets, sizes, file_offsets=None, *, direct=False,
  threads=0) -> list[int]` and `write_batch(paths, src, src_offsets, sizes,
  file_offsets=None, *, direct=False, fsync=False, threads=0) -> list[int]`: per-slice bytes
  or -errno (host buffers only). `probe_direct(dir)`, `drop_page_cache(paths)`.
- `crc32c(buffer, offset=0, size=-1, *, value=0) -> int`, `crc32c_batch(...) -> list[int]`.
- `memcpy_single(dst, dst_offset, src, src_offset, size)`: the benchmark's baseline.

Every call that moves bytes releases the GIL; from async code call it via asyncio.to_thread.
Bad offsets or sizes raise (ValueError, IndexError, TypeError) before any byte moves; the
ValueErrors, TypeErrors and RuntimeErrors are `tierd.native.errors`' classes, the same for
the C extension and the fallback.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import TYPE_CHECKING, Any

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


def _load() -> tuple[ModuleType, str]:
    """The implementation module and why it was chosen."""
    if os.environ.get("WARMGATE_NATIVE", "").lower() == "python":
        from tierd.native import _fallback

        return _fallback, "WARMGATE_NATIVE=python forces the pure-Python fallback"
    try:
        native = importlib.import_module("tierd.native._native")
    except ImportError as exc:
        from tierd.native import _fallback

        return _fallback, f"C extension not importable ({exc}); using the pure-Python fallback"
    return native, "C extension loaded"


_IMPL, _WHY = _load()

if TYPE_CHECKING:
    from tierd.native._native import (
        IMPLEMENTATION,
        BlockCopier,
        DeviceArena,
        HostArena,
        copy_batch,
        crc32c,
        crc32c_batch,
        drop_page_cache,
        memcpy_single,
        probe_direct,
        read_batch,
        write_batch,
    )
else:
    IMPLEMENTATION = _IMPL.IMPLEMENTATION
    BlockCopier = _IMPL.BlockCopier
    DeviceArena = _IMPL.DeviceArena
    HostArena = _IMPL.HostArena
    copy_batch = _IMPL.copy_batch
    crc32c = _IMPL.crc32c
    crc32c_batch = _IMPL.crc32c_batch
    drop_page_cache = _IMPL.drop_page_cache
    memcpy_single = _IMPL.memcpy_single
    probe_direct = _IMPL.probe_direct
    read_batch = _IMPL.read_batch
    write_batch = _IMPL.write_batch


def backends() -> dict[str, dict[str, Any]]:
    """Every backend with `built`, `usable`, `selected`, `reason` and its flags; the selected
    row (`host` for the C extension, else `python`) says in `why_selected` why it runs."""
    info: dict[str, dict[str, Any]] = _IMPL.backends()
    if IMPLEMENTATION == "c":
        info["python"] = {
            "built": True,
            "usable": True,
            "selected": False,
            "reason": "not used: the C extension is loaded",
        }
    for row in info.values():
        if row.get("selected"):
            row["why_selected"] = _WHY
    return info
