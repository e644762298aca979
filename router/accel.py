"""The router's per-block hot loops, accelerated: `hash_blocks` (chained xxh3 over a
prompt's blocks) and `lookup_runs` (the prefix index's walk over a chain), and the table
that walk reads: `new_block_map()` is a C `BlockMap` (u64 -> int, open addressing, a walk
that prefetches) or, in the fallback, a plain dict. `lookup_runs(table, hashes)` takes
either, so the index has one calling convention for both.

At import this picks the C extension `router._accel` (built by `pip install`, source
`_accel.c`) or, when it is missing or `WARMGATE_NATIVE=python` is set (the same switch as
tierd's native module), the pure-Python versions in `router._accel_py`. Both give the same
results bit for bit; `IMPLEMENTATION` ("c" or "python") and `REASON` say which runs and why.
Types and semantics: `_accel.pyi`.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import TYPE_CHECKING

__all__ = ["IMPLEMENTATION", "REASON", "hash_blocks", "lookup_runs", "new_block_map"]


def _load() -> tuple[ModuleType, str]:
    """The implementation module and why it was chosen."""
    if os.environ.get("WARMGATE_NATIVE", "").lower() == "python":
        from router import _accel_py

        return _accel_py, "WARMGATE_NATIVE=python forces the pure-Python fallback"
    try:
        native = importlib.import_module("router._accel")
    except ImportError as exc:
        from router import _accel_py

        return _accel_py, f"C extension not importable ({exc}); using the pure-Python fallback"
    return native, "C extension loaded"


_IMPL, REASON = _load()

if TYPE_CHECKING:
    from router._accel import IMPLEMENTATION, hash_blocks, lookup_runs, new_block_map
else:
    IMPLEMENTATION = _IMPL.IMPLEMENTATION
    hash_blocks = _IMPL.hash_blocks
    lookup_runs = _IMPL.lookup_runs
    new_block_map = _IMPL.new_block_map
