"""Plain counters and transfer-rate meters kept by the store; `/v1/stats` reports them and
`tierd.metrics` exposes the same numbers to Prometheus at scrape time (one source)."""

from __future__ import annotations

import logging
from collections import Counter, deque
from dataclasses import dataclass, field

log = logging.getLogger("tierd.store")

DIRECTIONS = (
    "put",
    "get",
    "array_to_l1",
    "snapshot_to_l1",
    "l1_to_array",
    "to_snapshot",
)


@dataclass
class StoreCounters:
    """Monotonic event counts, each keyed by one bounded label."""

    bytes_moved: Counter[str] = field(default_factory=Counter)  # by direction
    hits: Counter[str] = field(default_factory=Counter)  # by tier: l1, array, snapshot, miss
    prefetch: Counter[str] = field(default_factory=Counter)  # tierd.prefetch.OUTCOMES
    evictions: Counter[str] = field(default_factory=Counter)  # by tier
    demotions: Counter[str] = field(default_factory=Counter)  # l1_to_array, array_to_snapshot
    corrupt: Counter[str] = field(default_factory=Counter)  # by tier
    recovered: Counter[str] = field(default_factory=Counter)  # on start, by tier
    gated: int = 0  # L1 victims dropped by the frequency gate instead of written down
    write_failures: int = 0
    prefetch_requests: int = 0
    snapshots_written: int = 0
    idle_snapshots: int = 0


class ThroughputMeter:
    """A tier's throughput over its last `window` transfers: bytes ÷ time the tier was busy.

    Transfers overlap (parallel reads, queued emulated links), so each one adds only the part
    of its [start, end] interval not already covered by earlier ones; serial transfers give
    the plain per-transfer rate, concurrent ones the aggregate rate, and idle gaps count for
    nothing."""

    def __init__(self, window: int = 64) -> None:
        self._samples: deque[tuple[int, float]] = deque(maxlen=window)
        self._covered_until = 0.0

    def record(self, nbytes: int, start: float, end: float) -> None:
        busy = max(0.0, end - max(start, self._covered_until))
        self._covered_until = max(self._covered_until, end)
        if nbytes > 0:
            self._samples.append((nbytes, busy))

    def rate(self) -> float | None:
        total_b = sum(b for b, _ in self._samples)
        total_s = sum(s for _, s in self._samples)
        return total_b / total_s if total_s > 0 else None

    def __len__(self) -> int:
        return len(self._samples)


class DropLog:
    """Evicted slices lost because the array could not take them: when it last happened
    (for `/readyz`), and one warning line per `every_s` with the count."""

    def __init__(self, every_s: float = 10.0) -> None:
        self.last_at: float | None = None
        self._every_s = every_s
        self._logged_at = -1e18
        self._unlogged = 0

    def note(self, n: int, now: float, total: int) -> None:
        if not n:
            return
        self.last_at = now
        self._unlogged += n
        if now - self._logged_at >= self._every_s:
            log.warning(
                "array full or failing: %d evicted slices dropped (%d in all)",
                self._unlogged,
                total,
            )
            self._logged_at, self._unlogged = now, 0
