"""Run a module with its garbage collector watched: `python -m bench.soak_gcwatch OUT EVERY_S
MODULE [ARGS...]` runs MODULE as `__main__` (the gateway: `gateway.launch.serve --config ...`)
and every EVERY_S seconds appends one JSON line to OUT: the collections and pause seconds per
generation since the last line (from `gc.callbacks`), the objects each generation holds, the
permanent (frozen) generation's size, the thresholds, and the 20 most numerous types in the
oldest generation, the young ones together and the whole heap: what survives young
collections (types that grow in generation 2) and what a request in flight holds.

Diagnostic only (`warmgate bench soak --gc-watch S`): counting the heap by type holds the GIL
for a moment each period, so the soak's own figures from such a run are not its figures.
"""

from __future__ import annotations

import gc
import json
import runpy
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any


class _Pauses:
    def __init__(self) -> None:
        self.began = 0.0
        self.count = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self.collected = [0, 0, 0]

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.began = time.perf_counter()
            return
        g = info["generation"]
        self.count[g] += 1
        self.seconds[g] += time.perf_counter() - self.began
        self.collected[g] += info["collected"]

    def take(self) -> dict[str, Any]:
        out = {
            "collections": list(self.count),
            "pause_s": [round(s, 4) for s in self.seconds],
            "collected": list(self.collected),
        }
        self.count, self.seconds, self.collected = [0, 0, 0], [0.0, 0.0, 0.0], [0, 0, 0]
        return out


def _types(objs: list[Any]) -> dict[str, int]:
    return dict(Counter(type(o).__name__ for o in objs).most_common(20))


def sample(pauses: _Pauses, t0: float) -> dict[str, Any]:
    gens = [gc.get_objects(generation=g) for g in range(3)]
    young = gens[0] + gens[1]
    row: dict[str, Any] = {
        "t_s": round(time.monotonic() - t0, 1),
        "threshold": gc.get_threshold(),
        "count": gc.get_count(),
        "frozen": gc.get_freeze_count(),
        "objects": [len(g) for g in gens],
        **pauses.take(),
        "types_old": _types(gens[2]),
        "types_young": _types(young),
    }
    del gens, young
    return row


def _watch(out: Path, every_s: float, pauses: _Pauses) -> None:
    t0 = time.monotonic()
    while True:
        time.sleep(every_s)
        row = sample(pauses, t0)
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")


def main() -> None:
    out, every_s, module, *args = sys.argv[1:]
    pauses = _Pauses()
    gc.callbacks.append(pauses)
    threading.Thread(target=_watch, args=(Path(out), float(every_s), pauses), daemon=True).start()
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
