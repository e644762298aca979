"""The garbage collector's pauses, as `warmgate_gc_pause_seconds{generation}` (wall time:
every request in flight waits while a collection runs, so a p99 that grows with the
process's heap shows here first) and `warmgate_gc_cpu_seconds_total{generation}` (the CPU
the collections took: on a busy machine a pause also holds the time the process was
descheduled, so the CPU is what to put against the process's CPU). `gc.callbacks` is
process-wide: an app installs its watcher at start-up and removes it at shutdown (two apps
in one process each see every pause)."""

from __future__ import annotations

import gc
import time

from prometheus_client import CollectorRegistry, Counter, Histogram

from gateway.config.collector import CollectorSettings

PAUSE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class GcPauses:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.pauses = Histogram(
            "warmgate_gc_pause_seconds",
            "Garbage-collection pauses of the gateway's process, by generation (2: full).",
            ["generation"],
            buckets=PAUSE_BUCKETS,
            registry=registry,
        )
        self.cpu = Counter(
            "warmgate_gc_cpu_seconds",
            "CPU seconds the gateway's garbage collections took (its thread's), by generation.",
            ["generation"],
            registry=registry,
        )
        self._began = 0.0
        self._began_cpu = 0.0

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
            self._began_cpu = time.thread_time()
        elif self._began:
            generation = str(info["generation"])
            self.pauses.labels(generation).observe(time.perf_counter() - self._began)
            self.cpu.labels(generation).inc(time.thread_time() - self._began_cpu)
            self._began = 0.0

    def install(self) -> None:
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)

    async def remove(self) -> None:  # an AppState closer
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)


def tune_collector(settings: CollectorSettings) -> None:
    """The process's collector thresholds (gateway/config/collector.py says why). For the
    process that serves (`warmgate serve`), not for an app built inside another one."""
    gc.set_threshold(settings.young, settings.middle, settings.old)
