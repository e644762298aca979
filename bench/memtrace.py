"""Run a module under `tracemalloc`, writing what grows: `python -m bench.memtrace OUT EVERY_S
MODULE [ARGS...]` runs MODULE as `__main__` (the gateway: `gateway.launch.serve --config ...`) and,
from a thread, every EVERY_S seconds appends one JSON line to OUT: the traced bytes, the gc
counts and collections, the live objects by type (the 15 most numerous), and since the first
snapshot (taken one period after start) the growth of the 12 source files and of the 25
allocation sites (8 frames each) that grew most.

The module's own imports run before tracing starts (traced_mb counts what was allocated
after them). Diagnostic only (`warmgate bench soak --trace-memory`): tracemalloc slows every
allocation and the snapshots hold the GIL for a moment, so figures measured with it are not
the soak's figures.
"""

from __future__ import annotations

import gc
import importlib
import json
import runpy
import sys
import threading
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

FRAMES = 8


def _filtered(snap: tracemalloc.Snapshot) -> tracemalloc.Snapshot:
    return snap.filter_traces(
        [
            tracemalloc.Filter(False, tracemalloc.__file__),
            tracemalloc.Filter(False, "<frozen importlib._bootstrap*>"),
        ]
    )


def _site(stat: tracemalloc.StatisticDiff) -> dict[str, Any]:
    frames = [f"{f.filename}:{f.lineno}" for f in stat.traceback]
    return {
        "where": frames[-1] if frames else "?",  # most recent call last
        "stack": frames,
        "size_diff_kb": round(stat.size_diff / 1024, 1),
        "size_kb": round(stat.size / 1024, 1),
        "count_diff": stat.count_diff,
    }


def _short(path: str) -> str:
    for marker in ("site-packages/", "/lib/python3"):
        if marker in path:
            return path.split(marker, 1)[1]
    return str(Path(path).relative_to(Path.cwd())) if path.startswith(str(Path.cwd())) else path


def sample(first: tracemalloc.Snapshot | None, t0: float) -> tuple[dict[str, Any], Any]:
    snap = _filtered(tracemalloc.take_snapshot())
    types = Counter(type(o).__name__ for o in gc.get_objects())
    current, peak = tracemalloc.get_traced_memory()
    out: dict[str, Any] = {
        "t_s": round(time.monotonic() - t0, 1),
        "traced_mb": round(current / 2**20, 2),
        "traced_peak_mb": round(peak / 2**20, 2),
        "gc_counts": gc.get_count(),
        "gc_collections": [s["collections"] for s in gc.get_stats()],
        "gc_objects": sum(types.values()),
        "types": dict(types.most_common(15)),
    }
    if first is not None:
        top = snap.compare_to(first, "traceback")[:25]
        out["growth"] = [_site(s) for s in top]
        by_file = snap.compare_to(first, "filename")[:12]
        out["files_kb"] = {
            _short(s.traceback[0].filename): round(s.size_diff / 1024, 1) for s in by_file
        }
    return out, snap


def _watch(out: Path, every_s: float) -> None:
    t0 = time.monotonic()
    first = None
    while True:
        time.sleep(every_s)
        row, snap = sample(first, t0)
        first = first or snap
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")


def main() -> None:
    out, every_s, module, *args = sys.argv[1:]
    # its imports first, untraced: under tracemalloc they took the gateway ~20 s to start,
    # and what they allocate once is no growth; run_module then runs only its body again
    importlib.import_module(module)
    tracemalloc.start(FRAMES)
    threading.Thread(target=_watch, args=(Path(out), float(every_s)), daemon=True).start()
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
